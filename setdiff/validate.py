"""Preset validation: every section of a full preset built before any compute, and cross-section
rules (decode options must build a policy, a task's training batch and validation counts fit in
its splits). It checks the file, not this machine (devices are checked where a stage reads them,
`setdiff.preset.load_preset`). The ``preset`` and ``promote`` stages run it.

This module checks the sections many stages share (`CORE`). Every other top-level key is one
stage's own section, and every ``study`` key but tasks, paradigms and diffusion is one stage's
task list: each stage declares them in its module (``SECTION``, ``STUDY``, ``STUDY_TASKS``,
``STUDY_PARADIGMS``; see `setdiff.stages`) and checks its section in ``check_preset``. Here the
stage modules are found (`setdiff.stages.stage_names`) and imported when a preset is validated,
never statically: each stage imports only its own config records (see `setdiff.preset`), so its
DVC deps stay its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Literal

from setdiff.config import ConfigError
from setdiff.evaluate import EvalConfig
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import Params
from setdiff.preset import Preset
from setdiff.recipe import TaskTrainConfig
from setdiff.sampling.policies import check_decode
from setdiff.stages import stage_names
from setdiff.study import StudyConfig
from setdiff.tasks import ANSWER_TASKS, TASK_LAYOUTS, DataConfig
from setdiff.tokenizer import TokenizerConfig

CORE = ("preset", "study", "data", "tokenizer", "model", "paradigm", "train", "evaluate", "decode")
"""Top-level keys checked here; the others a preset may hold are the stages' ``SECTION``s."""

STUDY_FIELDS = ("tasks", "paradigms", "diffusion")
"""``study`` keys every stage shares (`StudyConfig` fields); the others are stages' ``STUDY``."""

_RECIPE_COUNTS = (
    ("ar.batch_size", "train"),
    ("diffusion.batch_size", "train"),
    ("ar.eval_examples", "valid"),
    ("diffusion.eval_examples", "valid"),
    ("curve.n_examples", "valid"),
)
"""``train.<task>`` fields that count examples of a split of the task (a batch draws from train)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stage:
    """What a stage module declares for validation (each part optional)."""

    name: str
    section: str | None
    """``SECTION``: the top-level params key the stage owns."""
    study: str | None
    """``STUDY``: the ``study`` key listing the tasks the stage runs on."""
    study_tasks: Literal["answers", "stream"] | None
    """``STUDY_TASKS``: what those tasks must be: with checkable answers, or text streams."""
    study_paradigms: tuple[str, ...]
    """``STUDY_PARADIGMS``: paradigms the study must train when the stage runs on a task."""
    check: Callable[[Preset, StudyConfig], None] | None
    """``check_preset``: the stage's validation of its section (and of its list)."""


def stages() -> list[Stage]:
    """Every stage's declarations, in name order (importing each stage module)."""
    found = []
    for name in stage_names():
        declared = vars(importlib.import_module(f"setdiff.stages.{name}"))
        found.append(
            Stage(
                name=name,
                section=declared.get("SECTION"),
                study=declared.get("STUDY"),
                study_tasks=declared.get("STUDY_TASKS"),
                study_paradigms=tuple(declared.get("STUDY_PARADIGMS", ())),
                check=declared.get("check_preset"),
            )
        )
    return found


def validate(params: Params | Preset) -> StudyConfig:
    """Build every section of a preset; raise `ConfigError` naming the first bad key."""
    preset = params if isinstance(params, Preset) else Preset(params)
    declared = stages()
    _check_keys(preset, declared)
    study = preset.study
    for stage in declared:
        if stage.study:
            _check_study_list(preset, study, stage, stage.study)
    _validate_core(preset, study)
    for stage in declared:
        if stage.check:
            stage.check(preset, study)
    return study


def _check_keys(preset: Preset, declared: list[Stage]) -> None:
    """Every top-level key is `CORE` or a stage's section; every ``study`` key a `StudyConfig`
    field or a stage's list."""
    path = preset.path
    top_level = (*CORE, *(s.section for s in declared if s.section))
    unknown = sorted(set(preset.params) - set(top_level))
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {unknown}; known {top_level}")
    section = preset.params.get_path("study")
    known = sorted([*STUDY_FIELDS, *(s.study for s in declared if s.study)])
    unknown = sorted(set(section) - set(known)) if isinstance(section, Mapping) else []
    if unknown:  # here, before `StudyConfig` takes a misspelt key for some stage's list
        raise ConfigError(f"{path}: study: unknown key(s) {unknown}; known {known}")


def _validate_core(preset: Preset, study: StudyConfig) -> None:
    """The sections many stages read: data, evaluate, and per task its tokenizer, model and
    training recipe; per paradigm its decode options."""
    path = preset.path
    preset.params.section("data", DataConfig)
    preset.section("evaluate", EvalConfig)
    for task in study.tasks:
        if preset.params.get_path("data").get(task) is None:
            raise ConfigError(f"{path}: data.{task} is missing (study.tasks lists {task})")
        preset.section(f"tokenizer.{task}", TokenizerConfig)
        model = preset.model(task)
        if model.pretrained is None:  # a checkpoint is only read by its stages
            model.config(vocab_size=8, seq_len=8)
        recipe = preset.section(f"train.{task}", TaskTrainConfig)
        preset.check_counts(task, f"train.{task}", recipe, _RECIPE_COUNTS)
    for name in study.paradigms:
        paradigm = make_paradigm(name, preset.paradigm(name), mask_id=0)
        check_decode(paradigm, preset.decode(name), f"{path}: decode.{name}")
    extra = sorted(set(preset.params.get_path("paradigm")) - set(PARADIGMS))
    if extra:
        raise ConfigError(f"{path}: paradigm: unknown paradigm(s) {extra}")


def _check_study_list(preset: Preset, study: StudyConfig, stage: Stage, name: str) -> None:
    """``study.<name>`` (`stage`'s list) holds tasks it may run on, and it has the paradigms it
    needs."""
    key = f"study.{name}"
    tasks = study.tasks_for(name)
    if stage.study_tasks == "answers":
        bad = [t for t in tasks if t not in ANSWER_TASKS]
        if bad:
            raise ConfigError(
                f"{preset.path}: {key}: {bad} have no checkable answers ({sorted(ANSWER_TASKS)})"
            )
    elif stage.study_tasks == "stream":
        bad = [t for t in tasks if TASK_LAYOUTS[t] != "stream"]
        if bad:
            raise ConfigError(f"{preset.path}: {key}: {bad} are not text (stream) tasks")
    missing = [p for p in stage.study_paradigms if p not in study.paradigms]
    if tasks and missing:
        raise ConfigError(
            f"{preset.path}: {key} lists {list(tasks)}: {stage.name} needs {missing} "
            f"in study.paradigms"
        )
