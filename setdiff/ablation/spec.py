"""The records an ablation is declared with: the preset's ``ablation`` section (`AblationConfig`:
space, budget, objectives, constraints, sampler, pruning, storage) and what the flow sends one
trial (`TrialSpec`), both built with ``Params.section`` / `setdiff.config.build`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from setdiff.ablation.knobs import KNOBS, METRICS, KnobSpace, check_knob
from setdiff.config import Seed, check, frozen


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
    """Median rule on the held-out loss of training trials (`setdiff.ablation.pruning`)."""

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
            check_knob(name, KNOBS[name], spec)
        bad = sorted((set(self.objectives) | set(self.constraints)) - set(METRICS))
        check(not bad, f"unknown metric(s) {bad}; known: {list(METRICS)}")
        n_objectives = len(self.objectives)
        check(len(set(self.objectives)) == n_objectives > 0, "objectives: non-empty, unique")
        check(
            self.sampler.name != "nsga2" or self.budget.batch >= 2,
            "nsga2 needs budget.batch >= 2 (its population)",
        )


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
