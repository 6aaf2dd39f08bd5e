"""The one look of every figure: seaborn theme (set once, by the entry points) and fixed colours.

Each paradigm has one colour, and each AR engine has one colour and marker, in every figure of
every report, so a reader learns them once. Colours are from the Okabe-Ito colour-blind-safe set.
"""

from __future__ import annotations

import seaborn as sns

PARADIGM_COLORS: dict[str, str] = {
    "ar": "#0072B2",
    "mdlm": "#E69F00",
    "bd3lm": "#009E73",
    "aogpt": "#CC79A7",
    "setdlm": "#D55E00",
}

ENGINE_COLORS: dict[str, str] = {
    "setdiff": PARADIGM_COLORS["ar"],  # our own AR decoder is the `ar` paradigm itself
    "transformers": "#56B4E9",
    "vllm": "#332288",
}

ENGINE_MARKERS: dict[str, str] = {"setdiff": "o", "transformers": "s", "vllm": "D"}

RUN_LINESTYLES: tuple[str, ...] = ("-", "--", ":", "-.")
"""Line style per run in comparison figures (first run solid, second dashed)."""

UNKNOWN_COLOR = "#7F7F7F"
MUTED_COLOR = "#BBBBBB"


def set_theme() -> None:
    """Set the seaborn theme for the whole process. Call once, from an entry point."""
    sns.set_theme(
        context="notebook",
        style="whitegrid",
        rc={"figure.dpi": 100, "savefig.dpi": 110, "axes.titlesize": "medium"},
    )


def series_color(paradigm: str, engine: str = "setdiff") -> str:
    """Colour of a series: the engine's colour for external AR engines, else the paradigm's."""
    if paradigm == "ar" and engine != "setdiff":  # "vllm+ngram k=2": vLLM's colour
        return ENGINE_COLORS.get(engine.split("+")[0], UNKNOWN_COLOR)
    return PARADIGM_COLORS.get(paradigm, UNKNOWN_COLOR)


def series_marker(engine: str, regime: str = "latency", source: str = "bench") -> str:
    """Marker of an engine: circles for our decoders (a plus for our AR decoder measured in the
    baseline stage), one shape per external engine, crosses for the throughput regime."""
    if regime != "latency":
        return "X"
    if engine == "setdiff" and source != "bench":
        return "P"
    return ENGINE_MARKERS.get(engine, "^")


def shades(color: str, n: int) -> list[tuple[float, float, float]]:
    """`n` shades of `color`, light to full, for configurations within one paradigm."""
    palette = sns.light_palette(color, n_colors=n + 1)
    return [tuple(c[:3]) for c in palette[1:]]  # type: ignore[misc]
