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

The recipe's own seed is not trained again: a cell whose training config is exactly the
recipe's (its seed and steps; the thread count aside, which leaves the weights bit-identical) is
the main run's model, ``models/<task>/<paradigm>``, which the train stage trained with that very
config (a fine-tune only when its seed's AR model is the main run's too). It is scored here as
the other cells are, and marked ``"model": "main run"``; the summary lists those seeds per
paradigm (``from_main_run``). So with seeds [0, 1, 2] the study trains two seeds, not three.

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
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from setdiff import retrain
from setdiff.artifacts import load_model
from setdiff.files import write_json
from setdiff.initial import weights_sha256
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
        if own_ar and paradigm != "ar" and is_main_run("ar", seed):
            ar_dir = layout.model("ar")  # the seed's AR model is the main run's
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

    def is_main_run(paradigm: str, seed: int) -> bool:
        """Whether the cell trains exactly the main run's model (its seed's AR included)."""
        main = recipe.for_paradigm(paradigm)
        same = dataclasses.replace(cell(paradigm, seed).train, threads=main.threads) == main
        return same and (not own_ar or paradigm == "ar" or is_main_run("ar", seed))

    # AR first: each seed's fine-tunes start from that seed's AR model.
    order = sorted(study.paradigms, key=lambda p: p != "ar")
    cells = [(cell(p, s), is_main_run(p, s)) for s in study.seeds for p in order]
    data = retrain.load_data(preset, layout, recipe, study.n_examples)
    if own_ar:  # each fine-tune's AR model (the seed's own, or the run's) is its `source`
        data = dataclasses.replace(data, source=None)
    inputs = retrain.input_hashes(data)
    for c, main_run in cells:  # before any compute: every main-run model is there
        if main_run:
            weights_sha256(layout.model(c.paradigm), _missing(layout.model(c.paradigm)))
    rows = [
        _main_run(out_dir, c, layout.model(c.paradigm), data, inputs)
        if main_run
        else retrain.cached_run(out_dir, c, data, inputs)
        for c, main_run in cells
    ]
    summary = {
        "task": args.task,
        "n_examples": len(data.records),
        "steps": study.steps,
        "threads": study.threads,
        "ar_per_seed": own_ar,
        # the cells' own seconds (training and scoring; a main-run cell's: scoring), summed:
        # the study's cost on one core per cell, whether its cells ran in turn or side by side
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


def _main_run(
    out_dir: Path, cell: retrain.Cell, model_dir: Path, data: retrain.Data, inputs: dict[str, Any]
) -> dict[str, Any]:
    """The row of a cell the train stage has trained: the main run's model in `model_dir`,
    scored as `retrain.run` scores a cell (kept like the others, keyed by its weights)."""
    spec = {
        "main_run": weights_sha256(model_dir, _missing(model_dir)),
        "decode": dict(cell.decode),
        "also_decode": None if cell.also_decode is None else dict(cell.also_decode),
        **inputs,
    }

    def score() -> dict[str, Any]:
        tic = time.perf_counter()
        model = load_model(model_dir, paradigm=cell.paradigm, task=data.task)
        also = {}
        if cell.also_decode is not None:
            extra = retrain.score(model, data, cell.also_decode)
            also = {"also": {"decode": dict(cell.also_decode), **extra}}
        last = json.loads((model_dir / "train_log.jsonl").read_text().splitlines()[-1])
        return {
            "paradigm": cell.paradigm,
            "seed": cell.train.seed,
            **retrain.score(model, data, cell.decode),
            **also,
            "steps": last["step"],
            "final_eval_loss": last["eval_loss"],
            "seconds": round(time.perf_counter() - tic, 1),  # scoring only: trained elsewhere
            "model": "main run",
        }

    return retrain.cached(out_dir / f"{cell.name}.json", spec, score)


def _missing(model_dir: Path) -> str:
    return f"{model_dir} has no trained model: run the train stage first (dvc repro train)"


def _summary(rows: list[dict[str, Any]], n_examples: int, recipe: TrainConfig) -> dict[str, Any]:
    """Mean, sample standard deviation, min and max over seeds, beside one run's binomial
    standard error; the same for the extra decode when there is one."""
    summary = {
        "seeds": [r["seed"] for r in rows],
        "from_main_run": [r["seed"] for r in rows if r.get("model") == "main run"],
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
