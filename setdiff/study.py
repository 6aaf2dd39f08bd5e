"""What a preset studies: the cells the pipeline runs (``study``)."""

from __future__ import annotations

from setdiff.config import check, frozen
from setdiff.paradigm import PARADIGMS
from setdiff.tasks import TASK_LAYOUTS, check_task


@frozen
class StudyConfig:
    """Which cells the pipeline runs (read by dvc.yaml's foreach/matrix)."""

    tasks: tuple[str, ...]
    paradigms: tuple[str, ...] = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
    """Every trained paradigm; `ar` is required (it is the baseline and the initialisation)."""
    diffusion: tuple[str, ...] = ("mdlm", "bd3lm", "aogpt", "setdlm")
    """The paradigms other than `ar`, trained after it from its weights. A derived value kept in
    params on purpose: dvc.yaml's ``train`` matrix iterates it, and DVC's templating cannot filter
    a list (``paradigms`` minus ``ar``); the alternative, one copy of each per-paradigm stage for
    ``ar`` and one for the rest, would duplicate their dependency lists. `__post_init__` refuses
    any value other than the derived one, so the two lists cannot drift apart."""
    floor: tuple[str, ...] = ()
    """Answer tasks whose quality floors (AR accuracy, setdlm gap) are checked: ``floor@<task>``."""
    ablate: tuple[str, ...] = ()
    """Answer tasks the Optuna ablation (``ablation`` section) runs on: ``ablate@<task>``."""
    textgen: tuple[str, ...] = ()
    """Text tasks judged for infilling and unconditional generation: ``textgen@<task>-<p>``."""
    backbone: tuple[str, ...] = ()
    """Answer tasks the backbone study (``backbone`` section) runs on: ``backbone@<task>``."""
    seeds: tuple[str, ...] = ()
    """Answer tasks the seed-variance study (``seeds`` section) runs on: ``seeds@<task>``."""
    setsize: tuple[str, ...] = ()
    """Answer tasks the set-size study (``setsize`` section) runs on: ``setsize@<task>``."""
    lossless: tuple[str, ...] = ()
    """Answer tasks whose lossless decoders (setdlm verify, AR + speculative decoding; the
    ``lossless`` section) are compared: ``lossless@<task>``."""

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
        for name in ("floor", "ablate", "textgen", "backbone", "seeds", "setsize", "lossless"):
            outside = [t for t in getattr(self, name) if t not in self.tasks]
            check(not outside, f"{name}: {outside} not in tasks {list(self.tasks)}")
        for name in ("floor", "lossless"):
            check(
                not getattr(self, name) or {"ar", "setdlm"} <= set(self.paradigms),
                f"{name} compares ar and setdlm: both must be in paradigms",
            )
        streams = [t for t in self.textgen if TASK_LAYOUTS[t] != "stream"]
        check(not streams, f"textgen: {streams} are not text (stream) tasks")
