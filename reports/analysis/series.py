"""How a run's configurations are named and ordered: the canonical paradigm order and the legend
label of one series. Shared by the analysis (sorting) and every figure and table.
"""

from __future__ import annotations

PARADIGMS: tuple[str, ...] = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
"""Canonical paradigm order: legends, facets and table rows follow it."""


def paradigm_order(names: object) -> list[str]:
    """`names` (any iterable of str) deduplicated, canonical paradigms first, others sorted."""
    present = set(names)  # type: ignore[call-overload]
    return [p for p in PARADIGMS if p in present] + sorted(present - set(PARADIGMS))


def series_label(
    paradigm: str,
    engine: str,
    regime: str = "latency",
    concurrency: int = 1,
    *,
    external: bool = False,
) -> str:
    """Legend label of one series: `setdlm`, `ar · vllm`, `ar · vllm (throughput)`.

    `external`: rows from the baseline stage, where even our own decoder is named by engine
    (`ar · setdiff`), since it was measured side by side with the other engines.
    """
    label = paradigm if engine == "setdiff" and not external else f"{paradigm} · {engine}"
    return f"{label} (throughput)" if regime == "throughput" else label
