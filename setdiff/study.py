"""What a preset studies: the cells the pipeline runs (``study``) and the backbone study
(``backbone``), its variants and the training budget each variant gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from setdiff.config import check, frozen
from setdiff.paradigm import PARADIGMS
from setdiff.tasks import TASK_LAYOUTS, check_task
from setdiff.train import TrainConfig


@frozen
class StudyConfig:
    """Which cells the pipeline runs (read by dvc.yaml's foreach/matrix)."""

    tasks: tuple[str, ...]
    paradigms: tuple[str, ...] = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
    """Every trained paradigm; `ar` is required (it is the baseline and the initialisation)."""
    diffusion: tuple[str, ...] = ("mdlm", "bd3lm", "aogpt", "setdlm")
    """The paradigms other than `ar`, trained after it (dvc.yaml cannot compute this list)."""
    floor: tuple[str, ...] = ()
    """Answer tasks whose quality floors (AR accuracy, setdlm gap) are checked: ``floor@<task>``."""
    ablate: tuple[str, ...] = ()
    """Answer tasks the Optuna ablation (``ablation`` section) runs on: ``ablate@<task>``."""
    textgen: tuple[str, ...] = ()
    """Text tasks judged for infilling and unconditional generation: ``textgen@<task>-<p>``."""
    backbone: tuple[str, ...] = ()
    """Answer tasks the backbone study (``backbone`` section) runs on: ``backbone@<task>``."""

    def __post_init__(self) -> None:
        check(len(self.tasks) > 0, "tasks must not be empty")
        for task in self.tasks:
            check_task(task)
        unknown = [p for p in self.paradigms if p not in PARADIGMS]
        check(not unknown, f"paradigms: unknown paradigms {unknown}; known {list(PARADIGMS)}")
        check("ar" in self.paradigms, "paradigms must include ar")
        expected = [p for p in self.paradigms if p != "ar"]
        check(
            list(self.diffusion) == expected,
            f"diffusion must list paradigms without ar, in order: {expected}",
        )
        for name in ("floor", "ablate", "textgen", "backbone"):
            outside = [t for t in getattr(self, name) if t not in self.tasks]
            check(not outside, f"{name}: {outside} not in tasks {list(self.tasks)}")
        check(
            not self.floor or {"ar", "setdlm"} <= set(self.paradigms),
            "floor compares ar and setdlm: both must be in paradigms",
        )
        streams = [t for t in self.textgen if TASK_LAYOUTS[t] != "stream"]
        check(not streams, f"textgen: {streams} are not text (stream) tasks")


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
