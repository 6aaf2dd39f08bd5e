"""The search space of an ablation study, resolved against a preset: what the flow samples from.

`search_space` validates the preset's ``ablation`` section (`setdiff.ablation.spec.AblationConfig`)
against the preset itself: every configuration the sampler can propose is resolved with
`setdiff.ablation.trial.resolve_trial` first, so a bad spec fails before any trial. It returns a
`SearchSpace` record: the knobs in sampling order, each with its range and the condition under
which it applies (`KnobRange.when`, from `setdiff.ablation.knobs.Knob.when`, the one definition
of that rule), the context the conditions see, the preset's own configuration (enqueued as the first
trial), the finite grid, and the study's name, objectives and budget. `resolve_space` is the same
record as plain JSON, the form ``setdiff trial --space`` writes for ``flows/ablation.py`` (which
cannot import this package).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from setdiff.ablation.knobs import (
    DEFAULT_PARADIGM,
    KNOBS,
    METRICS,
    RETRAIN,
    KnobSpace,
    applies,
    resolve_multiple,
)
from setdiff.ablation.spec import (
    AblationConfig,
    Bound,
    Budget,
    PruningConfig,
    SamplerConfig,
    TrialBudget,
)
from setdiff.ablation.trial import resolve_trial
from setdiff.artifacts import run_id
from setdiff.config import ConfigError, frozen, to_dict
from setdiff.paradigm import PARADIGMS, SetDLMConfig, make_paradigm
from setdiff.params import Params
from setdiff.sampling.policies import decode_policy
from setdiff.tasks import ANSWER_TASKS

if TYPE_CHECKING:
    from setdiff.study import StudyConfig


MAX_GRID = 20_000
"""Largest space `resolve_space` enumerates (every point is validated before any trial)."""


@frozen
class Objective:
    name: str
    direction: Literal["maximize", "minimize"]


@frozen
class KnobRange:
    """One knob as the sampler sees it."""

    name: str
    integer: bool
    """An integer knob (``suggest_int`` for a range)."""
    when: Mapping[str, tuple[Any, ...]]
    """The knob applies when every named earlier knob (or context value) is one of these."""
    spec: KnobSpace


@frozen
class SearchSpace:
    """A validated study: what the flow samples, how it judges trials, and its budget."""

    task: str
    preset: str
    study: str
    """``ablation.study``, or ``<task>-<preset>-<hash of the spec and the preset sections>``."""
    storage: str | None
    objectives: tuple[Objective, ...]
    constraints: Mapping[str, Bound]
    sampler: SamplerConfig
    budget: Budget
    pruning: PruningConfig | None
    trial_budget: TrialBudget
    """The part of `budget` each trial receives (in its `setdiff.ablation.spec.TrialSpec`)."""
    trains: bool
    """The space has training knobs (`setdiff.ablation.knobs.RETRAIN`): every trial trains."""
    knobs: tuple[KnobRange, ...]
    """In sampling order (a condition only looks at earlier knobs)."""
    context: Mapping[str, Any]
    """Values the conditions see for knobs that are not in the space."""
    default: Mapping[str, Any]
    """The preset's own configuration in knob terms (the first trial)."""
    grid: tuple[Mapping[str, Any], ...] | None
    """Every configuration when the space is finite, else None."""


def search_space(params: Params, task: str) -> SearchSpace:
    """Validate ``ablation`` against the preset and return the study's `SearchSpace`.

    Raises:
        ConfigError: a task without answers, a knob that never applies, more trials than the
            finite space has configurations, or any configuration `resolve_trial` refuses.
    """
    config = params.section("ablation", AblationConfig)
    where = f"{params.path}: ablation"
    if task not in ANSWER_TASKS:
        raise ConfigError(f"{where}: task {task!r} has no answers; use one of {list(ANSWER_TASKS)}")
    context = _context(params, config)
    points = enumerate_space(config.space, context)
    for point in points:
        resolve_trial(params, point)
    for name in config.space:
        if not any(name in point for point in points):
            raise ConfigError(
                f"{where}: space.{name} never applies (it needs {KNOBS[name].when()})"
            )
    finite = all(s.choices is not None or KNOBS[n].kind is int for n, s in config.space.items())
    if finite and config.budget.n_trials > len(points):
        raise ConfigError(
            f"{where}: budget.n_trials={config.budget.n_trials} exceeds the {len(points)} "
            "distinct configurations of the space"
        )
    preset = str(params.get("preset", params.path.stem))
    return SearchSpace(
        task=task,
        preset=preset,
        study=config.study or f"{task}-{preset}-{_fingerprint(params, config, task)}",
        storage=config.storage,
        objectives=tuple(Objective(name=n, direction=METRICS[n]) for n in config.objectives),
        constraints=config.constraints,
        sampler=config.sampler,
        budget=config.budget,
        pruning=config.pruning,
        trial_budget=TrialBudget(
            n_examples=config.budget.n_examples,
            train_steps=config.budget.train_steps,
            eval_every=config.budget.eval_every,
        ),
        trains=any(k in config.space for k in RETRAIN),
        knobs=tuple(_knob_range(n, config.space[n]) for n in KNOBS if n in config.space),
        context=context,
        default=_default_point(params, config, context),
        grid=tuple(points) if finite else None,
    )


def resolve_space(params: Params, task: str) -> dict[str, Any]:
    """`search_space` as plain JSON (what ``setdiff trial --space`` writes for the flow)."""
    return to_dict(search_space(params, task))


def validate_ablation(params: Params, study: StudyConfig) -> AblationConfig:
    """Preset validation of ``ablation`` for every answer task of the study."""
    tasks = [t for t in study.tasks if t in ANSWER_TASKS]
    if not tasks:
        raise ConfigError(f"{params.path}: ablation needs an answer task ({list(ANSWER_TASKS)})")
    config = params.section("ablation", AblationConfig)
    choices = config.space["paradigm"].choices if "paradigm" in config.space else None
    missing = sorted(set(choices or (DEFAULT_PARADIGM,)) - set(study.paradigms))
    if missing:
        raise ConfigError(f"{params.path}: ablation: paradigm(s) {missing} are not in the study")
    for task in tasks:
        search_space(params, task)
    return config


def _context(params: Params, config: AblationConfig) -> dict[str, Any]:
    """Values the knob conditions see when a knob is not in the space."""
    spec = config.space.get("paradigm")
    choices = spec.choices if spec is not None and spec.choices else (DEFAULT_PARADIGM,)
    window = resolve_trial(params, {}).options.get("window")
    return {
        "paradigm": DEFAULT_PARADIGM if DEFAULT_PARADIGM in choices else choices[0],
        "order": "any" if window == "all" else "sliding",
    }


def _candidates(name: str, spec: KnobSpace) -> list[Any]:
    if spec.choices is not None:
        return list(spec.choices)
    assert spec.low is not None and spec.high is not None
    if KNOBS[name].kind is int:
        step = 1 if spec.log else int(spec.step or 1)
        return list(range(int(spec.low), int(spec.high) + 1, step))
    return [spec.low, spec.high]  # a float range is validated at both ends


def enumerate_space(space: Mapping[str, KnobSpace], context: Mapping[str, Any]) -> list[dict]:
    """Every configuration the space can produce, each with only the knobs that apply to it."""
    points: list[dict[str, Any]] = [{}]
    for name in KNOBS:
        if name not in space:
            continue
        values = _candidates(name, space[name])
        grown = []
        for point in points:
            if applies(name, {**context, **point}):
                grown += [{**point, name: value} for value in values]
            else:
                grown.append(point)
        points = grown
        if len(points) > MAX_GRID:
            raise ConfigError(f"ablation: the space has more than {MAX_GRID} points to validate")
    return points


def _default_point(params: Params, config: AblationConfig, context: dict) -> dict[str, Any]:
    """The preset's own configuration in knob terms (enqueued as the first trial)."""
    plan = resolve_trial(params, {"paradigm": context["paradigm"]})
    policy = decode_policy(make_paradigm(plan.paradigm, plan.config, mask_id=0), plan.options)
    cfg, name = plan.config, plan.paradigm
    preset: dict[str, Any] = {"paradigm": name, "order": context["order"]}
    field = PARADIGMS[name][1].set_size_field
    if field is not None:
        preset["set_size"] = getattr(cfg, field)
    if isinstance(cfg, SetDLMConfig):
        preset |= {"max_set_size": cfg.max_set_size, "exponent": cfg.exponent}
        preset["window"] = policy.window
    if name in KNOBS["threshold"].paradigms:
        preset["threshold"] = "off" if policy.threshold is None else policy.threshold
    point: dict[str, Any] = {}
    for knob in KNOBS:
        if knob in config.space and applies(knob, {**context, **point}):
            point[knob] = _express(knob, config.space[knob], preset[knob], preset.get("set_size"))
    return point


def _express(name: str, spec: KnobSpace, value: Any, set_size: int | None) -> Any:
    """`value` as written in the space (e.g. window 4 with D = 4 -> "D"); ConfigError if absent."""
    if spec.choices is None:
        assert spec.low is not None and spec.high is not None
        if isinstance(value, int | float) and spec.low <= value <= spec.high:
            return value
    else:
        if name == "max_set_size" and value is None and None not in spec.choices:
            value = 2 * (set_size or 0)
        for choice in spec.choices:
            if choice == value or (set_size and resolve_multiple(choice, set_size) == value):
                return choice
    raise ConfigError(
        f"ablation: the preset's {name} = {value!r} is not in space.{name}; the preset's "
        "configuration is enqueued as the first trial, so the space must contain it"
    )


def _knob_range(name: str, spec: KnobSpace) -> KnobRange:
    knob = KNOBS[name]
    return KnobRange(name=name, integer=knob.kind is int, when=knob.when(), spec=spec)


def _fingerprint(params: Params, config: AblationConfig, task: str) -> str:
    """Hash of the spec (minus the budget's n_trials, timeout and workers, so raising them
    continues the study) and of the preset sections a trial's result depends on."""
    spec = to_dict(config)
    resumable = ("n_trials", "timeout_s", "workers")
    spec["budget"] = {k: v for k, v in spec["budget"].items() if k not in resumable}
    keys = [f"{s}.{task}" for s in ("data", "tokenizer", "model", "train")]
    keys += ["paradigm", "decode", "bench.run"]
    return run_id(task, spec, {k: params.get_path(k) for k in keys})[:8]
