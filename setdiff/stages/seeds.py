"""Seed variance: diffusion accuracy per training seed, mean and sd; metrics/.

DVC stage ``seeds``: the seed variance of every paradigm's accuracy, measured.

``setdiff seeds --task arith`` reads the ``seeds`` section (paradigms, training seeds, steps,
test prompts, extra decodes), ``train.<task>``, ``paradigm.<p>``, ``decode.<p>`` and
``model.<task>``. For every (paradigm, seed) cell it trains that paradigm exactly as the train
stage does (same ``train.<task>`` recipe with only ``seed``, and ``steps`` when given, replaced;
same ``paradigm.<p>``) and decodes the first ``n_examples`` test prompts greedily with
``decode.<p>``, as the evaluate stage does, recording exact-match accuracy and tokens per
forward (and the same for ``also_decode.<p>``, e.g. the run's headline configuration).

Where the fine-tunes start: with ``ar`` among the paradigms, each seed first trains its own AR
model (kept in ``results/seeds/<task>/models/ar-<seed>``) and that seed's fine-tunes start from
it, so a seed varies everything a second machine varies (the AR model included); without it,
every fine-tune starts from the run's ``models/<task>/ar`` and the spread is the fine-tune's.

What a training seed varies: `TrainConfig.seed` seeds the global torch RNG before the weights are
built (`setdiff.initial.initial_weights`) and the training generator, which draws every batch
(the data order) and the paradigm's training noise (orders, masked positions, times); the
held-out loss uses ``seed + 1``. The data and the test prompts stay fixed. The decode's own
sampler seed stays at its default (greedy decoding draws nothing).

Cells are trained, scored and kept as `setdiff.retrain` does
(``results/seeds/<task>/<paradigm>-<seed>.json``; a re-run skips every finished cell whose
inputs are unchanged, a seed's AR model included). ``metrics/seeds/<task>.json`` holds, per
paradigm, the seeds and their accuracies, mean, sample standard deviation, min and max, and the
binomial standard error of one run's accuracy at ``n_examples`` prompts (what the report's
bootstrap CIs measure) for comparison. The main run's accuracy (the recipe's seed,
``metrics/evaluate/<task>/<p>.json``) is joined by the report.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from setdiff import retrain
from setdiff.files import write_json
from setdiff.measure import fingerprint
from setdiff.preset import Preset
from setdiff.recipe import SeedStudyConfig, TaskTrainConfig
from setdiff.stages.common import start
from setdiff.study import StudyConfig
from setdiff.train import TrainConfig

PARAMS: tuple[str, ...] = ("seeds", "train.{task}", "paradigm", "decode", "model.{task}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

SECTION = "seeds"
"""The params section this stage owns (`check_preset` validates it)."""
STUDY = "seeds"
"""``study.seeds``: the tasks this stage runs on (``seeds@<task>``)."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``seeds`` builds (required when ``study.seeds``
    lists a task) and trains only paradigms the study trains."""
    if "seeds" in preset or study.tasks_for("seeds"):
        seeds = preset.section("seeds", SeedStudyConfig)
        study.check_trained(seeds.paradigms, preset.path, "seeds.paradigms")


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Seed variance: every paradigm's accuracy per training seed.", answers=True
    )
    study = preset.section("seeds", SeedStudyConfig)
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    steps = {} if study.steps is None else {"steps": study.steps}
    if study.threads is not None:
        steps["threads"] = study.threads
    out_dir = Path(args.root) / "results" / "seeds" / args.task
    own_ar = "ar" in study.paradigms and recipe.init_from_ar

    def cell(paradigm: str, seed: int) -> retrain.Cell:
        ar_dir = out_dir / "models" / f"ar-{seed}"
        return retrain.make_cell(
            preset,
            recipe,
            paradigm,
            name=f"{paradigm}-{seed}",
            where=f"seeds (train.{args.task}, {paradigm})",
            train={"seed": seed, **steps},
            keep=ar_dir if own_ar and paradigm == "ar" else None,
            source=ar_dir if own_ar and paradigm != "ar" else None,
            also_decode=study.also_decode.get(paradigm),
        )

    # AR first: each seed's fine-tunes start from that seed's AR model.
    order = sorted(study.paradigms, key=lambda p: p != "ar")
    cells = [cell(p, s) for s in study.seeds for p in order]
    data = retrain.load_data(preset, layout, recipe, study.n_examples)
    if own_ar:  # no cell starts from the run's AR model: its hash is no input of theirs
        data = dataclasses.replace(data, source=None)
    inputs = retrain.input_hashes(data)
    rows = [retrain.cached_run(out_dir, c, data, inputs) for c in cells]
    summary = {
        "task": args.task,
        "n_examples": len(data.records),
        "steps": study.steps,
        "threads": study.threads,
        "ar_per_seed": own_ar,
        # the cells' own seconds (training and scoring), summed: the study's cost on one core
        # per cell, whether its cells ran one after another or side by side
        "cell_seconds": sum(float(r.get("seconds", 0.0)) for r in rows),
        "fingerprint": fingerprint(
            torch.device("cpu"),
            params_hash=preset.digest("seeds", f"train.{args.task}", "paradigm", "decode"),
        ),
        "paradigms": {
            name: _summary(
                [r for r in rows if r["paradigm"] == name],
                len(data.records),
                recipe.for_paradigm(name),
            )
            for name in study.paradigms
        },
    }
    write_json(Path(args.root) / "metrics" / "seeds" / f"{args.task}.json", summary)


def _summary(rows: list[dict[str, Any]], n_examples: int, recipe: TrainConfig) -> dict[str, Any]:
    """Mean, sample standard deviation, min and max over seeds, beside one run's binomial
    standard error; the same for the extra decode when there is one."""
    summary = {
        "seeds": [r["seed"] for r in rows],
        **_spread([float(r["accuracy"]) for r in rows], n_examples),
        "tokens_per_forward": [r.get("tokens_per_forward") for r in rows],
        "steps": rows[0]["steps"],
        "recipe_seed": recipe.seed,
        "recipe_steps": recipe.steps,
    }
    if all("also" in r for r in rows):
        summary["also"] = {
            "decode": rows[0]["also"]["decode"],
            **_spread([float(r["also"]["accuracy"]) for r in rows], n_examples),
            "tokens_per_forward": [r["also"]["tokens_per_forward"] for r in rows],
        }
    return summary


def _spread(accuracies: list[float], n_examples: int) -> dict[str, Any]:
    mean = statistics.fmean(accuracies)
    return {
        "accuracies": accuracies,
        "n": len(accuracies),
        "mean": mean,
        "sd": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
        "min": min(accuracies),
        "max": max(accuracies),
        "binomial_se": math.sqrt(mean * (1 - mean) / n_examples),
    }
