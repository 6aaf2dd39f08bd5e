"""Preset validation: every section of a full preset built before any compute, and cross-section
rules (bench and lmeval tasks must be study tasks with answers, decode options must build a
policy, a task's training batch and validation counts fit in its splits). It checks the file,
not this machine (devices are checked where a stage reads them, `setdiff.preset.load_preset`).
The ``preset`` and ``promote`` stages run it; it is the one module that imports every stage's
config record (each stage imports only its own, see `setdiff.preset`)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from setdiff.ablation.space import validate_ablation
from setdiff.baselines.config import BaselineConfig
from setdiff.bench.config import BenchRunConfig, configurations, throughput_configurations
from setdiff.bench.lossless import LosslessConfig, check_windows
from setdiff.config import ConfigError, to_dict
from setdiff.evaluate import EvalConfig
from setdiff.lmeval.config import LmevalConfig
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import Params
from setdiff.preset import Preset
from setdiff.recipe import (
    BackboneStudyConfig,
    SeedStudyConfig,
    SetSizeStudyConfig,
    TaskTrainConfig,
)
from setdiff.sampling.policies import decode_policy
from setdiff.study import StudyConfig
from setdiff.tasks import ANSWER_TASKS, DataConfig
from setdiff.textgen import TextGenConfig
from setdiff.tokenizer import TokenizerConfig

TOP_LEVEL = (
    "preset",
    "study",
    "data",
    "tokenizer",
    "model",
    "paradigm",
    "train",
    "evaluate",
    "decode",
    "bench",
    "textgen",
    "baseline",
    "ablation",
    "backbone",
    "seeds",
    "setsize",
    "lossless",
    "lmeval",
)
"""Every top-level key a preset may hold (each is read by some stage)."""


def validate(params: Params | Preset) -> StudyConfig:
    """Build every section of a preset; raise `ConfigError` naming the first bad key."""
    preset = params if isinstance(params, Preset) else Preset(params)
    path = preset.path
    unknown = sorted(set(preset.params) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {unknown}; known {TOP_LEVEL}")
    study = preset.study
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
        _check_counts(preset, task, f"train.{task}", recipe, _RECIPE_COUNTS)
    for name in study.paradigms:
        _check_decode(preset, name, preset.decode(name), f"decode.{name}")
    answer_only = [
        t
        for name in ("floor", "ablate", "backbone", "seeds", "setsize", "lossless")
        for t in getattr(study, name)
        if t not in ANSWER_TASKS
    ]
    if answer_only:
        raise ConfigError(
            f"{path}: study.floor/ablate/backbone/seeds/setsize/lossless: {answer_only} have no "
            f"checkable answers ({sorted(ANSWER_TASKS)})"
        )
    if "backbone" in preset or study.backbone:
        preset.section("backbone", BackboneStudyConfig)
    if "seeds" in preset or study.seeds:
        _validate_retrain(preset, study, "seeds", SeedStudyConfig)
    if "setsize" in preset or study.setsize:
        _validate_retrain(preset, study, "setsize", SetSizeStudyConfig)
    if "lossless" in preset or study.lossless:
        lossless = preset.section("lossless", LosslessConfig)
        if study.lossless:
            check_windows(lossless, preset.paradigm("setdlm"), str(path))
    if study.ablate and "ablation" not in preset:
        raise ConfigError(f"{path}: study.ablate lists {list(study.ablate)}: add ablation")
    _validate_bench(preset, study)
    preset.section("baseline", BaselineConfig)
    if study.textgen:
        preset.section("textgen", TextGenConfig)
    _validate_lmeval(preset, study)
    if "ablation" in preset:
        steps = validate_ablation(preset.params, study).budget.train_steps
        for task, name in ((t, p) for t in study.ablate for p in study.diffusion):
            warmup = (
                preset.section(f"train.{task}", TaskTrainConfig).for_paradigm(name).warmup_steps
            )
            if steps < warmup:  # a trial fine-tunes with its recipe, for train_steps
                raise ConfigError(
                    f"{path}: ablation.budget.train_steps: {steps} < the warmup_steps {warmup} "
                    f"of train.{task} ({name})"
                )
    extra = sorted(set(preset.params.get_path("paradigm")) - set(PARADIGMS))
    if extra:
        raise ConfigError(f"{path}: paradigm: unknown paradigm(s) {extra}")
    return study


def _check_decode(preset: Preset, name: str, options: Mapping[str, Any], where: str) -> None:
    paradigm = make_paradigm(name, preset.paradigm(name), mask_id=0)
    try:
        decode_policy(paradigm, dict(options))
    except ValueError as err:
        raise ConfigError(f"{preset.path}: {where}: {err}") from None


def _validate_retrain(
    preset: Preset, study: StudyConfig, key: str, cls: type[SeedStudyConfig | SetSizeStudyConfig]
) -> None:
    """``seeds`` / ``setsize`` (required when ``study.<key>`` lists a task): its paradigms are
    trained ones."""
    section = preset.section(key, cls)
    outside = [p for p in section.paradigms if p not in study.paradigms]
    if outside:
        raise ConfigError(f"{preset.path}: {key}.paradigms: {outside} not in study.paradigms")


def _validate_lmeval(preset: Preset, study: StudyConfig) -> None:
    """``lmeval`` (required by dvc.yaml's ``foreach: ${lmeval.tasks}``; ``tasks: []`` = off)."""
    lmeval = preset.section("lmeval", LmevalConfig)
    bad = [t for t in lmeval.tasks if t not in study.tasks or t not in ANSWER_TASKS]
    if bad:
        raise ConfigError(
            f"{preset.path}: lmeval.tasks: {bad} must be study tasks with answers "
            f"({sorted(ANSWER_TASKS)})"
        )
    outside = [p for p in lmeval.paradigms if p not in study.paradigms]
    if outside:
        raise ConfigError(f"{preset.path}: lmeval.paradigms: {outside} not in study.paradigms")


def _validate_bench(preset: Preset, study: StudyConfig) -> None:
    run = preset.section("bench.run", BenchRunConfig)
    configs = configurations(preset.bench_sweep, preset.decode, study.paradigms, str(preset.path))
    throughput_configurations(configs, run.throughput.configs, str(preset.path))
    for task in preset.bench_tasks:
        if task not in study.tasks or task not in ANSWER_TASKS:
            raise ConfigError(
                f"{preset.path}: bench.tasks: {task!r} must be a study task with "
                f"answers ({sorted(ANSWER_TASKS)})"
            )
        _check_counts(preset, task, "bench.run", run, (("n_select", "valid"),))
    for config in configs:
        where = f"bench.sweep.{config.paradigm} ({config.label})"
        _check_decode(preset, config.paradigm, config.options, where)


_RECIPE_COUNTS = (
    ("ar.batch_size", "train"),
    ("diffusion.batch_size", "train"),
    ("ar.eval_examples", "valid"),
    ("diffusion.eval_examples", "valid"),
    ("curve.n_examples", "valid"),
)
"""``train.<task>`` fields that count examples of a split of the task (a batch draws from train)."""


def _check_counts(
    preset: Preset, task: str, key: str, record: Any, counts: tuple[tuple[str, str], ...]
) -> None:
    """Each ``(field, split)`` of `record` (the section at `key`) is at most the size of
    `task`'s split where the preset fixes it (``data.<task>.n_<split>``): more examples than a
    split holds, or a batch larger than the train split, is a typo that fails or silently
    runs on fewer. (The counts of sections shared by all tasks, such as
    ``evaluate.n_likelihood``, are caps: each task takes at most that many and records how
    many it took.)"""
    sizes = to_dict(preset.data(task))
    for field, split in counts:
        size, value = sizes.get(f"n_{split}"), operator.attrgetter(field)(record)
        if size is not None and value > size:
            raise ConfigError(
                f"{preset.path}: {key}.{field}: {value} is more than the {size} {split} "
                f"examples of data.{task} (n_{split})"
            )
