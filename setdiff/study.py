"""What a preset studies: the cells the pipeline runs (``study``).

Besides the tasks and paradigms every stage shares, ``study`` holds one task list per stage that
runs on some tasks only (``study.<name>``: dvc.yaml's ``foreach: ${study.<name>}``). Each such
stage declares its list in its module (``STUDY``, and what the list may hold: see
`setdiff.stages`) and `setdiff.validate` checks the list against that; this record keeps every
list within ``tasks`` and needs no field for a new stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from setdiff.config import ConfigError, check, frozen, rest
from setdiff.paradigm import PARADIGMS
from setdiff.tasks import check_task


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
    stage_tasks: Mapping[str, tuple[str, ...]] = rest()
    """Every other key of ``study``: a stage's task list (``floor: [arith]`` runs
    ``floor@arith``), named by the stage's ``STUDY``; `setdiff.validate` refuses any other key."""

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
        for name, listed in self.stage_tasks.items():
            outside = [t for t in listed if t not in self.tasks]
            check(not outside, f"{name}: {outside} not in tasks {list(self.tasks)}")

    def tasks_for(self, stage: str) -> tuple[str, ...]:
        """``study.<stage>``: the tasks that stage runs on (none when the key is absent)."""
        return self.stage_tasks.get(stage, ())

    def check_trained(self, listed: tuple[str, ...], path: Path, where: str) -> None:
        """Refuse paradigms `listed` at `where` (``seeds.paradigms``) that the study does not
        train (``study.paradigms``)."""
        outside = [p for p in listed if p not in self.paradigms]
        if outside:
            raise ConfigError(f"{path}: {where}: {outside} not in study.paradigms")
