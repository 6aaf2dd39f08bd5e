"""The knobs of an ablation study: what each one is (`KNOBS`, with the one rule for when it
applies, `Knob.when` / `applies`), one knob's range (`KnobSpace`) and the metrics a trial reports
(`METRICS`).

Knobs (`KNOBS`) are only what `setdiff` implements (see `setdiff.sampling.policies`):
  paradigm      which diffusion paradigm a trial trains/decodes (setdlm, bd3lm, mdlm, aogpt)
  set_size      D for setdlm; the block size S for bd3lm (its set-size analogue)
  max_set_size  s_max of the setdlm order schedule: ints, "kD" multiples of D, or null (= 2D)
  exponent      survival exponent k of the setdlm schedule; null = derived from D
  order         setdlm decode order: "sliding" (W positions from the leftmost undecoded one) or
                "any" (window "all", any-order); both accept the most confident tokens first
  window        W for order "sliding": ints or "kD" multiples of D; every W must be <= s_max
  threshold     tau: also accept each candidate with confidence >= tau; "off" = one per step
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Literal

from setdiff.config import check, frozen

METRICS: dict[str, Literal["maximize", "minimize"]] = {
    "accuracy": "maximize",
    "tokens_per_second": "maximize",
    "nfe_mean": "minimize",
    "tokens_per_forward": "maximize",
}
"""What a trial reports (`setdiff.ablation.trial.summarize`) and the direction of each."""

DIFFUSION = ("setdlm", "bd3lm", "mdlm", "aogpt")
DEFAULT_PARADIGM = "setdlm"
"""The paradigm of a trial whose knobs do not name one."""

_MULTIPLE = re.compile(r"^([1-9]\d*)?D$")


@dataclasses.dataclass(frozen=True, slots=True)
class Knob:
    """What one knob is: its value type, where it applies, which words it takes."""

    kind: type
    paradigms: tuple[str, ...]
    requires: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Other knobs' values under which this one applies, e.g. window needs order "sliding"."""
    words: tuple[str, ...] = ()
    multiples: bool = False
    """Choices may be "D", "2D", ... (multiples of the trial's set size)."""
    nullable: bool = False

    def when(self) -> dict[str, tuple[Any, ...]]:
        """The condition under which this knob applies: each named value must be one of these."""
        return {"paradigm": self.paradigms, **dict(self.requires)}


KNOBS: dict[str, Knob] = {
    "paradigm": Knob(str, DIFFUSION, words=DIFFUSION),
    "set_size": Knob(int, ("setdlm", "bd3lm")),
    "max_set_size": Knob(int, ("setdlm",), multiples=True, nullable=True),
    "exponent": Knob(float, ("setdlm",), nullable=True),
    "order": Knob(str, ("setdlm",), words=("sliding", "any")),
    "window": Knob(int, ("setdlm",), (("order", ("sliding",)),), multiples=True),
    "threshold": Knob(float, ("setdlm", "bd3lm", "mdlm"), words=("off",)),
}
"""Every knob, in the order a trial samples them (conditions only look at earlier knobs)."""

RETRAIN = ("set_size", "max_set_size", "exponent")
"""Knobs that change the trained model: a space with any of them trains every trial."""


@frozen
class KnobSpace:
    """One knob's range: ``choices`` or ``low``/``high`` (with ``step`` or ``log``)."""

    choices: tuple[int | float | str | None, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    def __post_init__(self) -> None:
        if self.choices is not None:
            check(
                self.low is None and self.high is None and self.step is None and not self.log,
                "give either choices or low/high, not both",
            )
            check(len(self.choices) > 0, "empty range: choices must not be empty")
            check(len(set(map(repr, self.choices))) == len(self.choices), "duplicate choices")
            return
        check(self.low is not None and self.high is not None, "give choices, or low and high")
        check(self.low < self.high, f"empty range: low={self.low} must be < high={self.high}")
        check(self.step is None or 0 < self.step <= self.high - self.low, "bad step")
        check(not self.log or (self.low > 0 and self.step is None), "log needs low > 0, no step")


def check_knob(name: str, knob: Knob, spec: KnobSpace) -> None:
    if spec.choices is None:
        check(knob.kind is not str, f"space.{name}: give choices (it takes {list(knob.words)})")
        if knob.kind is int:
            ends = (spec.low, spec.high, spec.step or 1)
            check(all(float(v).is_integer() for v in ends), f"space.{name}: integer range")
        return
    for value in spec.choices:
        if value is None:
            ok = knob.nullable
        elif isinstance(value, str):
            ok = value in knob.words or (knob.multiples and bool(_MULTIPLE.match(value)))
        else:
            ok = knob.kind is float or (knob.kind is int and isinstance(value, int))
        words = [*knob.words, *(["D", "2D", "..."] if knob.multiples else [])]
        check(ok, f"space.{name}: bad choice {value!r} (a {knob.kind.__name__} or {words})")


def resolve_multiple(value: Any, set_size: int) -> Any:
    """ "D" -> set_size, "2D" -> 2 * set_size; anything else unchanged."""
    match = _MULTIPLE.match(value) if isinstance(value, str) else None
    return int(match.group(1) or 1) * set_size if match else value


def applies(name: str, values: Mapping[str, Any]) -> bool:
    """Whether knob `name` applies given the values chosen so far (plus the context)."""
    return all(values.get(other) in allowed for other, allowed in KNOBS[name].when().items())
