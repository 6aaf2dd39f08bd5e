"""Training recipes: ``train.<task>`` (one `TrainConfig` for AR and one for the diffusion
paradigms, with per-paradigm overrides, and the accuracy curve logged while training) and the
backbone study's ``backbone`` (its variants and the budget each one gets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from setdiff.config import ConfigError, build, check, frozen, to_dict
from setdiff.paradigm import PARADIGMS
from setdiff.train import TrainConfig


@frozen
class CurveConfig:
    """``train.<task>.curve``: answer accuracy at every evaluation, so a reader of the training
    curves sees whether a paradigm had converged (answer tasks, single-process runs)."""

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
