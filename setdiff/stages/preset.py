"""``setdiff preset <name>``: validate params/<name>.yaml completely, then make it params.yaml.

params.yaml is the active preset that every DVC stage reads; switching presets rewrites it, and
DVC re-runs exactly the stages whose params values changed. Validation builds every section into
its config record first, so a typo fails here, naming the file and key, before any compute.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from setdiff.artifacts import write_text
from setdiff.config import ConfigError
from setdiff.evaluate import ANSWER_TASKS
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import Params, load_params
from setdiff.search import validate_ablation
from setdiff.stages.backbone import BackboneStudyConfig
from setdiff.stages.baseline import BaselineConfig
from setdiff.stages.bench import BenchRunConfig, configurations, throughput_configurations
from setdiff.stages.common import StudyConfig, model_config, paradigm_config, pretrained_source
from setdiff.stages.evaluate import EvalConfig
from setdiff.stages.lmeval import LmevalConfig
from setdiff.stages.textgen import TextGenConfig
from setdiff.stages.train import TaskTrainConfig
from setdiff.tasks import DataConfig
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
    "lmeval",
)
"""Every top-level key a preset may hold (each is read by some stage)."""


def validate(params: Params) -> StudyConfig:
    """Build every section of a preset; raise `ConfigError` naming the first bad key."""
    unknown = sorted(set(params) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{params.path}: unknown top-level key(s) {unknown}; known {TOP_LEVEL}")
    study = params.section("study", StudyConfig)
    params.section("data", DataConfig)
    params.section("evaluate", EvalConfig)
    for task in study.tasks:
        if params.get_path("data").get(task) is None:
            raise ConfigError(f"{params.path}: data.{task} is missing (study.tasks lists {task})")
        params.section(f"tokenizer.{task}", TokenizerConfig)
        if pretrained_source(params, task) is None:  # a checkpoint is only read by its stages
            model_config(params, task, vocab_size=8, seq_len=8)
        params.section(f"train.{task}", TaskTrainConfig)
    for name in study.paradigms:
        paradigm = make_paradigm(name, paradigm_config(params, name), mask_id=0)
        options = params.get_path(f"decode.{name}") or {}
        try:
            paradigm.decode_policy(dict(options))
        except ValueError as err:
            raise ConfigError(f"{params.path}: decode.{name}: {err}") from None
    answer_only = [
        t for t in (*study.floor, *study.ablate, *study.backbone) if t not in ANSWER_TASKS
    ]
    if answer_only:
        raise ConfigError(
            f"{params.path}: study.floor/ablate/backbone: {answer_only} have no checkable "
            f"answers ({sorted(ANSWER_TASKS)})"
        )
    if "backbone" in params or study.backbone:
        params.section("backbone", BackboneStudyConfig)
    if study.ablate and "ablation" not in params:
        raise ConfigError(f"{params.path}: study.ablate lists {list(study.ablate)}: add ablation")
    _validate_bench(params, study)
    params.section("baseline", BaselineConfig)
    if study.textgen:
        params.section("textgen", TextGenConfig)
    _validate_lmeval(params, study)
    if "ablation" in params:
        validate_ablation(params, study)
    extra = sorted(set(params.get_path("paradigm")) - set(PARADIGMS))
    if extra:
        raise ConfigError(f"{params.path}: paradigm: unknown paradigm(s) {extra}")
    return study


def _validate_lmeval(params: Params, study: StudyConfig) -> None:
    """``lmeval`` (required by dvc.yaml's ``foreach: ${lmeval.tasks}``; ``tasks: []`` = off)."""
    lmeval = params.section("lmeval", LmevalConfig)
    bad = [t for t in lmeval.tasks if t not in study.tasks or t not in ANSWER_TASKS]
    if bad:
        raise ConfigError(
            f"{params.path}: lmeval.tasks: {bad} must be study tasks with answers "
            f"({sorted(ANSWER_TASKS)})"
        )
    outside = [p for p in lmeval.paradigms if p not in study.paradigms]
    if outside:
        raise ConfigError(f"{params.path}: lmeval.paradigms: {outside} not in study.paradigms")


def _validate_bench(params: Params, study: StudyConfig) -> None:
    run = params.section("bench.run", BenchRunConfig)
    configs = configurations(params, study.paradigms)
    throughput_configurations(configs, run.throughput.configs, str(params.path))
    for task in params.get_path("bench.tasks"):
        if task not in study.tasks or task not in ANSWER_TASKS:
            raise ConfigError(
                f"{params.path}: bench.tasks: {task!r} must be a study task with "
                f"answers ({sorted(ANSWER_TASKS)})"
            )
    for config in configs:
        paradigm = make_paradigm(
            config.paradigm, paradigm_config(params, config.paradigm), mask_id=0
        )
        try:
            paradigm.decode_policy(dict(config.options))
        except ValueError as err:
            raise ConfigError(
                f"{params.path}: bench.sweep.{config.paradigm} ({config.label}): {err}"
            ) from None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="setdiff preset", description=__doc__)
    parser.add_argument("name", help="preset name: a file params/<name>.yaml (smoke, default, gpu)")
    parser.add_argument("--dir", default="params", help="folder of presets (default: params)")
    parser.add_argument("--out", default="params.yaml", help="active params file to write")
    args = parser.parse_args(argv)
    source = Path(args.dir) / f"{args.name}.yaml"
    if not source.exists():
        names = sorted(p.stem for p in Path(args.dir).glob("*.yaml"))
        raise ConfigError(f"unknown preset {args.name!r}: no {source}; available: {names}")
    study = validate(load_params(source))
    header = (
        f"# ACTIVE PRESET: generated by `setdiff preset {args.name}` from {source}.\n"
        f"# Edit {source} (or add a preset) and re-run `setdiff preset`, not this file.\n"
    )
    write_text(args.out, header + source.read_text())
    print(f"{args.out} <- {source} (tasks {list(study.tasks)}, paradigms {list(study.paradigms)})")
