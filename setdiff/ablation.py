"""Ablation studies: the knobs, the spec records declared in params (``ablation:``), one trial.

Optuna lives in ``flows/``; nothing here imports it. Here: the knobs (`KNOBS`, each with the one
rule for when it applies, `Knob.when` / `applies`), the spec records (`AblationConfig`, built
with ``Params.section``), the trial spec the flow sends (`TrialSpec`), `resolve_trial` (knob
values -> paradigm config and decode options), `should_prune` (the median rule for training
trials) and `summarize` / `constraint_values` (what a trial reports). The space resolved against
a preset (what the flow samples from) is `setdiff.search`.

Why the median rule is ours and not ``optuna.pruners.MedianPruner``: Optuna cannot prune
multi-objective studies (``Trial.should_prune`` raises; the default objectives are accuracy and
NFE); the rule compares only trials equal on ``pruning.group_by`` (a larger D has a higher loss by
design) and counts each distinct curve once (trials that reused a cached model repeat it), which
``MedianPruner`` cannot express; and the decision is taken inside the trial's subprocess against
peers fixed when the trial starts, so it does not depend on which parallel trial finishes first.

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
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from setdiff.config import ConfigError, Seed, check, frozen
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import Params

METRICS: dict[str, Literal["maximize", "minimize"]] = {
    "accuracy": "maximize",
    "tokens_per_second": "maximize",
    "nfe_mean": "minimize",
    "tokens_per_forward": "maximize",
}
"""What a trial reports (see `summarize`) and the direction each one is optimised in."""

DIFFUSION = ("setdlm", "bd3lm", "mdlm", "aogpt")
DEFAULT_PARADIGM = "setdlm"
"""The paradigm of a trial whose knobs do not name one."""
MAX_GRID = 20_000
"""Largest space `resolve_space` enumerates (every point is validated before any trial)."""

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


@frozen
class Budget:
    n_trials: int
    """Finished (complete or pruned) trials the study runs to; a re-run continues to this."""
    batch: int = 2
    """Trials asked per round (the NSGA-II population). The sampler sees results only between
    rounds, so a study is the same however many workers run a round."""
    n_examples: int = 20
    """Test prompts each trial decodes (the first ones)."""
    train_steps: int = 100
    """Reduced training budget of a trial whose space has training knobs."""
    eval_every: int = 25
    """Held-out loss evaluations of a training trial (what pruning looks at)."""
    timeout_s: float = 600.0
    """Wall budget of one flow run (no round starts after it) and of each trial."""
    workers: int = 2
    """Trials the ``ablate`` stage runs at once (its local Dask cluster); 1 when one trial
    fills the machine (a 1.7B fine-tune on one GPU)."""

    def __post_init__(self) -> None:
        counts = (self.n_trials, self.batch, self.n_examples, self.train_steps, self.eval_every)
        counts += (self.workers,)
        check(min(counts) >= 1 and self.timeout_s > 0, "budget values must be positive")


@frozen
class Bound:
    """A feasibility constraint on a reported metric (e.g. an accuracy floor)."""

    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        check(self.min is not None or self.max is not None, "a constraint needs min or max")


@frozen
class SamplerConfig:
    name: Literal["nsga2", "tpe"] = "nsga2"
    seed: Seed = 0


@frozen
class PruningConfig:
    """Median rule on the held-out loss of training trials (see `should_prune`)."""

    min_trials: int = 2
    """Comparable completed trials with a loss at a step before any trial is pruned there."""
    warmup_steps: int = 0
    """No pruning before this step."""
    group_by: tuple[str, ...] = ()
    """Knobs a completed trial must share to be compared (e.g. [set_size]: a larger D has a
    higher loss by design, and a plain median would prune every large-D trial)."""

    def __post_init__(self) -> None:
        check(self.min_trials >= 1 and self.warmup_steps >= 0, "min_trials >= 1, warmup >= 0")
        unknown = sorted(set(self.group_by) - set(KNOBS))
        check(not unknown, f"group_by: unknown knob(s) {unknown}")


@frozen
class AblationConfig:
    """``ablation``: one Optuna study over `KNOBS` on an answer task."""

    space: Mapping[str, KnobSpace]
    budget: Budget
    objectives: tuple[str, ...] = ("accuracy", "nfe_mean")
    """Reported metrics optimised jointly (directions in `METRICS`); Pareto set = best trials."""
    constraints: Mapping[str, Bound] = dataclasses.field(default_factory=dict)
    sampler: SamplerConfig = SamplerConfig()
    pruning: PruningConfig | None = PruningConfig()
    """None = never prune."""
    storage: str | None = None
    """Optuna storage: an RDB URL (``postgresql://...``, ``sqlite:///...``) or a journal file
    path; None = the journal file ``<ablations>/<task>/journal.log`` of the flow's study folder
    (``ablations/`` for the DVC stage, ``studies/`` by hand)."""
    study: str | None = None
    """Study name; None = ``<task>-<preset>-<hash of the space and the preset it runs on>``."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.space) - set(KNOBS))
        check(not unknown, f"space: unknown knob(s) {unknown}; known: {list(KNOBS)}")
        check(len(self.space) > 0, "space must name at least one knob")
        for name, spec in self.space.items():
            _check_knob(name, KNOBS[name], spec)
        bad = sorted((set(self.objectives) | set(self.constraints)) - set(METRICS))
        check(not bad, f"unknown metric(s) {bad}; known: {list(METRICS)}")
        n_objectives = len(self.objectives)
        check(len(set(self.objectives)) == n_objectives > 0, "objectives: non-empty, unique")
        check(
            self.sampler.name != "nsga2" or self.budget.batch >= 2,
            "nsga2 needs budget.batch >= 2 (its population)",
        )


def _check_knob(name: str, knob: Knob, spec: KnobSpace) -> None:
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


@dataclasses.dataclass(frozen=True, slots=True)
class TrialPlan:
    """What one trial trains and decodes."""

    paradigm: str
    config: Any
    """The paradigm's config record (the preset's, with the training knobs applied)."""
    options: dict[str, Any]
    """Decode options (the preset's ``decode.<paradigm>``, with the decode knobs applied)."""


def resolve_trial(params: Params, knobs: Mapping[str, Any]) -> TrialPlan:
    """Apply knob values to the preset's paradigm config and decode options, and validate both.

    Raises:
        ConfigError: unknown knob, a knob that does not apply, or an invalid result (W > s_max,
            s_max < D, tau out of range, ...), naming the knob values.
    """
    name = knobs.get("paradigm", DEFAULT_PARADIGM)
    where = f"{params.path}: ablation trial {dict(knobs)}"
    if name not in DIFFUSION:
        raise ConfigError(f"{where}: paradigm must be one of {list(DIFFUSION)}")
    unknown = sorted(set(knobs) - set(KNOBS))
    stray = [k for k in knobs if k in KNOBS and name not in KNOBS[k].paradigms]
    if unknown or stray:
        raise ConfigError(f"{where}: unknown knob(s) {unknown}, not for {name}: {stray}")
    base = params.section(f"paradigm.{name}", PARADIGMS[name][0])
    train = {k: knobs[k] for k in RETRAIN if k in knobs}
    field = PARADIGMS[name][1].set_size_field  # D is `set_size` for setdlm, `block_size` for bd3lm
    if "set_size" in train and field != "set_size":
        train = {**{k: v for k, v in train.items() if k != "set_size"}, field: train["set_size"]}
    if "max_set_size" in train:
        train["max_set_size"] = resolve_multiple(
            train["max_set_size"], train.get("set_size", base.set_size)
        )
    options = dict(params.get_path(f"decode.{name}") or {})
    try:
        config = dataclasses.replace(base, **train)
        if knobs.get("order") == "any":
            options["window"] = "all"
        elif "window" in knobs:
            options["window"] = resolve_multiple(knobs["window"], config.set_size)
        if knobs.get("order") == "sliding" and options.get("window") == "all":
            raise ValueError("order 'sliding' needs a window: add window to the space")
        if "threshold" in knobs:
            options["threshold"] = knobs["threshold"]
        make_paradigm(name, config, mask_id=0).decode_policy(dict(options))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return TrialPlan(paradigm=name, config=config, options=options)


@frozen
class TrialBudget:
    """The part of `Budget` one trial uses."""

    n_examples: int = 20
    train_steps: int = 100
    eval_every: int = 25


@frozen
class TrialPruning(PruningConfig):
    """The median rule of one training trial, with its reference fixed when the trial starts."""

    peers: tuple[Mapping[str, Any], ...] = ()
    """Completed trials as ``{"knobs": {...}, "curve": [[step, loss], ...]}`` (`should_prune`)."""


@frozen
class TrialSpec:
    """What the flow asks of one trial (``trial.json``; ``setdiff trial --spec``)."""

    study: str
    number: int
    knobs: Mapping[str, Any]
    """The sampled knob values (only those that apply)."""
    trains: bool
    """Train the trial's model (the space has training knobs) instead of loading the preset's."""
    budget: TrialBudget
    task: str | None = None
    """Informational: the trial command's ``--task`` decides."""
    prune: TrialPruning | None = None
    """None = never prune (or a decode-only trial)."""
    constraints: Mapping[str, Bound] = dataclasses.field(default_factory=dict)

    def label(self) -> str:
        """``"set_size=4 threshold=0.9"``, or ``"default"`` with no knobs."""
        return " ".join(f"{k}={v}" for k, v in self.knobs.items()) or "default"


def should_prune(
    step: int,
    loss: float,
    knobs: Mapping[str, Any],
    peers: Sequence[Mapping[str, Any]],
    *,
    min_trials: int,
    warmup_steps: int,
    group_by: Sequence[str] = (),
) -> bool:
    """The median rule for a training trial's held-out loss.

    Optuna cannot prune multi-objective trials (``Trial.should_prune`` raises), so the decision
    is this single-objective rule on the training signal, applied by the trial itself: prune at
    ``step`` when at least `min_trials` comparable completed trials logged a loss at that same
    step and `loss` is above their median (Optuna's ``MedianPruner`` rule). `peers` are the
    completed trials as ``{"knobs": {...}, "curve": [[step, loss], ...]}``, fixed when the trial
    starts, so the decision does not depend on which other trials finish first; comparable =
    equal on every knob of `group_by`; each distinct curve counts once.
    """
    if math.isnan(loss):
        return True
    if step < warmup_steps:
        return False
    # Trials that reused a cached model repeat its curve: each distinct curve counts once.
    curves = {
        tuple((int(s), float(v)) for s, v in peer["curve"])
        for peer in peers
        if all(peer["knobs"].get(k) == knobs.get(k) for k in group_by)
    }
    values = [dict(curve)[step] for curve in curves if step in dict(curve)]
    return len(values) >= min_trials and loss > statistics.median(values)


def summarize(rows: Sequence[Any]) -> dict[str, float]:
    """A trial's metrics from its `setdiff.measure.Row`s (one per decoded example)."""
    check(len(rows) > 0, "no rows to summarize")
    tokens = sum(r.new_tokens for r in rows)
    return {
        "accuracy": sum(r.exact for r in rows) / len(rows),
        "tokens_per_second": tokens / max(sum(r.latency_s for r in rows), 1e-9),
        "nfe_mean": sum(r.nfe for r in rows) / len(rows),
        "tokens_per_forward": tokens / max(sum(r.nfe for r in rows), 1),
        "n": len(rows),
    }


def constraint_values(
    summary: Mapping[str, float], constraints: Mapping[str, Bound]
) -> dict[str, float]:
    """Optuna's convention: one value per bound, feasible when <= 0."""
    out = {}
    for metric, bound in constraints.items():
        if bound.min is not None:
            out[f"{metric}_min"] = bound.min - summary[metric]
        if bound.max is not None:
            out[f"{metric}_max"] = summary[metric] - bound.max
    return out
