"""Training recipes: ``train.<task>`` (one `TrainConfig` for AR and one for the diffusion
paradigms, with per-paradigm overrides, and the accuracy curve of its evaluations), the
backbone study's ``backbone`` (its variants and the budget each one gets) and the seed study's
``seeds`` (which paradigms are retrained with which seeds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from setdiff.config import ConfigError, build, check, frozen, to_dict
from setdiff.paradigm import PARADIGMS
from setdiff.train import TrainConfig


@frozen
class CurveConfig:
    """``train.<task>.curve``: answer accuracy at every evaluation, so a reader of the training
    curves sees whether a paradigm had converged (answer tasks, single-process runs). Training
    keeps each evaluation's weights; the curve stage (`setdiff.stages.curve`) decodes them."""

    n_examples: int = 0
    """Validation prompts decoded greedily at each evaluation; 0 = no accuracy curve."""
    decode: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Decode options per paradigm (the paradigm's defaults where absent). They live here, not
    in ``decode``, so that changing how the evaluate stage decodes does not retrain a model."""

    def __post_init__(self) -> None:
        check(self.n_examples >= 0, f"n_examples must be >= 0, got {self.n_examples}")
        unknown = sorted(set(self.decode) - set(PARADIGMS))
        check(not unknown, f"decode: unknown paradigm(s) {unknown}; use {list(PARADIGMS)}")


@frozen
class TaskTrainConfig:
    """``train.<task>``: one recipe for AR, one for the diffusion paradigms."""

    ar: TrainConfig
    diffusion: TrainConfig
    init_from_ar: bool = True
    """Start diffusion paradigms from this task's trained AR weights (else from scratch)."""
    curve: CurveConfig = dataclasses.field(default_factory=CurveConfig)
    paradigms: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Per diffusion paradigm, fields of ``diffusion`` it overrides (e.g. ``setdlm: {steps:
    1600}``): the budget follows what each paradigm needs."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.paradigms) - (set(PARADIGMS) - {"ar"}))
        check(not unknown, f"paradigms: {unknown} are not diffusion paradigms (ar has its own)")
        for name in self.paradigms:
            try:  # a bad field is refused when the preset is read, naming the file and key
                self.for_paradigm(name)
            except ConfigError as err:
                raise ValueError(str(err)) from None

    def for_paradigm(self, name: str) -> TrainConfig:
        if name == "ar":
            return self.ar
        overrides = self.paradigms.get(name)
        if not overrides:
            return self.diffusion
        return build(TrainConfig, {**to_dict(self.diffusion), **overrides}, f"paradigms.{name}")


@frozen
class BackboneStudyConfig:
    """``backbone``: the variants compared and the budget each one gets."""

    variants: Mapping[str, Mapping[str, Any]]
    """Name -> overrides of ``model.<task>`` (any `ModelConfig` field), ``ar_context_loss`` and
    ``diffusion`` (overrides of the fine-tune's `TrainConfig`)."""
    ar: TrainConfig
    diffusion: TrainConfig
    set_sizes: tuple[int, ...] = (2, 4)
    n_examples: int = 300
    """Test prompts decoded per model."""

    def __post_init__(self) -> None:
        check(len(self.variants) > 0, "variants must not be empty")
        check(len(self.set_sizes) > 0 and min(self.set_sizes) >= 1, "set_sizes must be >= 1")
        check(self.n_examples >= 1, "n_examples must be >= 1")


@frozen
class SeedStudyConfig:
    """``seeds``: the paradigms trained again once per training seed, with the ``train.<task>``
    recipe otherwise unchanged (the seed-variance study). With ``ar`` listed, each seed trains
    its own AR model and that seed's fine-tunes start from it (a different AR model is part of
    what varies between machines); without it, every fine-tune starts from the run's AR model."""

    paradigms: tuple[str, ...] = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
    """Paradigms trained per seed (each needs ``paradigm.<p>`` and ``decode.<p>``)."""
    seeds: tuple[int, ...] = (1, 2)
    """Training seeds (`TrainConfig.seed`); the recipe's own seed is the main run's model."""
    steps: int | None = None
    """Training steps; None = the paradigm's own ``train.<task>`` recipe steps."""
    n_examples: int = 500
    """Test prompts decoded greedily per model (the first ones)."""
    threads: int | None = None
    """Intra-op threads of every cell's training; None = each recipe's own. One lets two seeds
    train side by side on 2 cores (two 2-thread jobs oversubscribe them)."""
    also_decode: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Per paradigm, decode options scored too on the same model (over ``decode.<p>``): the
    run's headline configuration, so its comparison with AR can be checked on every seed."""

    def __post_init__(self) -> None:
        bad = [p for p in self.paradigms if p not in PARADIGMS]
        check(not bad, f"paradigms: {bad} are not paradigms; use {sorted(PARADIGMS)}")
        check(len(self.paradigms) > 0, "paradigms must not be empty")
        check(len(set(self.paradigms)) == len(self.paradigms), "paradigms: duplicates")
        check(len(self.seeds) > 0, "seeds must not be empty")
        check(len(set(self.seeds)) == len(self.seeds), f"seeds: duplicates in {list(self.seeds)}")
        check(self.steps is None or self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        check(self.n_examples >= 1, f"n_examples must be >= 1, got {self.n_examples}")
        check(
            self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}"
        )
        stray = sorted(set(self.also_decode) - set(self.paradigms))
        check(not stray, f"also_decode: {stray} are not in paradigms {list(self.paradigms)}")


SET_SIZE_KEYS = {"setdlm": "set_size", "bd3lm": "block_size"}
"""The ``paradigm.<p>`` field that is the set size D of each paradigm that has one."""


@frozen
class SetSizeStudyConfig:
    """``setsize``: set diffusion at other set sizes D than ``paradigm.<p>``'s, fine-tuned with
    the ``train.<task>`` recipe otherwise unchanged (the set-size study; the main run's models
    are the preset's own D)."""

    paradigms: tuple[str, ...] = ("setdlm",)
    """setdlm (``set_size`` D, decoded at window W = D) and bd3lm (``block_size`` S = D)."""
    set_sizes: tuple[int, ...] = (2,)
    """The set sizes trained (one model per paradigm and size)."""
    start: Literal["ar", "main"] = "ar"
    """Where each fine-tune starts: ``ar``, the task's AR model (the paper's recipe, as the main
    run's models); ``main``, the main run's model of the paradigm (``models/<task>/<p>``, trained
    at the preset's D), continued at D."""
    steps: int | None = None
    """Fine-tuning steps; None = the paradigm's own ``train.<task>`` recipe steps."""
    lr: float | None = None
    """Peak learning rate; None = the paradigm's own recipe's."""
    threads: int | None = None
    """Training threads; None = the recipe's (one for fine-tunes that run side by side, where
    this stage runs alone)."""
    decode_main: bool = True
    """Also decode the main run's setdlm model at window W = D, untrained at D: what the
    window alone gives, beside what training at D adds."""
    n_examples: int = 500
    """Test prompts decoded greedily per model (the first ones)."""

    def __post_init__(self) -> None:
        check(self.start in ("ar", "main"), f"start must be ar|main, got {self.start!r}")
        check(self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.threads is None or self.threads >= 0, f"threads must be >= 0: {self.threads}")
        bad = [p for p in self.paradigms if p not in SET_SIZE_KEYS]
        check(not bad, f"paradigms: {bad} have no set size; use {list(SET_SIZE_KEYS)}")
        check(len(self.paradigms) > 0, "paradigms must not be empty")
        check(len(set(self.paradigms)) == len(self.paradigms), "paradigms: duplicates")
        check(len(self.set_sizes) > 0, "set_sizes must not be empty")
        check(min(self.set_sizes) >= 1, f"set_sizes must be >= 1, got {list(self.set_sizes)}")
        check(len(set(self.set_sizes)) == len(self.set_sizes), "set_sizes: duplicates")
        check(self.steps is None or self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        check(self.n_examples >= 1, f"n_examples must be >= 1, got {self.n_examples}")
