"""One ablation trial (train at a reduced budget or load, then decode); result.json.

``setdiff trial``: the command line of one ablation trial, run by the flow as a subprocess.

``setdiff trial --task arith --spec trial.json --out DIR [--cache DIR]`` reads the preset's
``paradigm``, ``decode``, ``train.<task>``, ``model.<task>`` and ``bench.run`` plus the trial spec
that ``flows/ablation.py`` writes (`setdiff.ablation.spec.TrialSpec`)::

    {"study", "number", "knobs": {...}, "trains": bool, "budget": {...},
     "prune": {"peers", "min_trials", "warmup_steps", "group_by"} | null, "constraints": {...}}

and runs `setdiff.ablation.trial.run_trial`, which writes ``DIR/result.json`` (and
``DIR/train_log.jsonl`` for a training trial).

``setdiff trial --task arith --space FILE`` validates the preset's ``ablation`` section and writes
the resolved search space that the flow samples from; the flow runs it before any trial.

Exit status 2 = a configuration or value error (never worth a retry); the flow treats any other
failure (killed, crashed) as an infrastructure fault.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from setdiff.ablation.space import resolve_space, validate_ablation
from setdiff.ablation.spec import TrialSpec
from setdiff.ablation.trial import run_trial
from setdiff.bench.config import BenchRunConfig
from setdiff.config import ConfigError, build
from setdiff.files import write_json
from setdiff.preset import Preset, load_preset
from setdiff.recipe import TaskTrainConfig
from setdiff.stages.common import Layout, setup_logging
from setdiff.study import StudyConfig
from setdiff.tasks import check_task

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
"""Exit status of a configuration/value error (argparse uses it for usage errors too)."""

SECTION = "ablation"
"""The params section this stage owns (`check_preset` validates it)."""
STUDY = "ablate"
"""``study.ablate``: the tasks the ablation flow (DVC stage ``ablate@<task>``) runs trials on."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`) of ``ablation`` (required when ``study.ablate``
    lists a task): its search space resolves for every answer task, and a training trial runs
    at least the warm-up of each recipe it fine-tunes with."""
    tasks = study.tasks_for("ablate")
    if tasks and "ablation" not in preset:
        raise ConfigError(f"{preset.path}: study.ablate lists {list(tasks)}: add ablation")
    if "ablation" not in preset:
        return
    steps = validate_ablation(preset.params, study).budget.train_steps
    for task, name in ((t, p) for t in tasks for p in study.diffusion):
        warmup = preset.section(f"train.{task}", TaskTrainConfig).for_paradigm(name).warmup_steps
        if steps < warmup:  # a trial fine-tunes with its recipe, for train_steps
            raise ConfigError(
                f"{preset.path}: ablation.budget.train_steps: {steps} < the warmup_steps "
                f"{warmup} of train.{task} ({name})"
            )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff trial",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml", help="params file (active preset)")
    parser.add_argument("--task", required=True, help="an answer task, e.g. arith")
    parser.add_argument("--root", default=".", help="directory holding data/ and models/")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--spec", help="trial spec (JSON) written by the ablation flow")
    mode.add_argument("--space", help="write the validated search space (JSON) here and exit")
    parser.add_argument("--out", help="trial directory (with --spec): result.json, train_log")
    parser.add_argument("--cache", help="directory of models trained by earlier trials")
    args = parser.parse_args(argv)
    if args.spec and not args.out:
        parser.error("--spec needs --out")
    setup_logging()
    try:
        check_task(args.task)
        preset = load_preset(args.params)
        if args.space:
            write_json(args.space, _space(preset, args.task))
        else:
            spec = build(TrialSpec, json.loads(Path(args.spec).read_text()), args.spec)
            cache = Path(args.cache) if args.cache else None
            run_trial(preset, spec, Layout(args.root, args.task), Path(args.out), cache)
    except (ConfigError, ValueError) as err:
        print(f"setdiff trial: {type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def _space(preset: Preset, task: str) -> dict[str, Any]:
    space = resolve_space(preset.params, task)
    preset.section("bench.run", BenchRunConfig)  # noqa: B018 (built for its errors)
    if space["trains"]:
        preset.section(f"train.{task}", TaskTrainConfig)
    return space
