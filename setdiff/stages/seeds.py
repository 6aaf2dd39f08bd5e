"""DVC stage ``seeds``: the seed variance of the diffusion paradigms' accuracy, measured.

``setdiff seeds --task arith`` reads the ``seeds`` section (paradigms, training seeds, steps,
test prompts), ``train.<task>``, ``paradigm.<p>``, ``decode.<p>`` and ``model.<task>``. For every
(paradigm, seed) cell it trains that paradigm exactly as the train stage does (same starting
weights, ``models/<task>/ar`` under the paper's recipe, same ``train.<task>`` recipe for the
paradigm with only ``seed``, and ``steps`` when given, replaced; same ``paradigm.<p>``) and
decodes the first ``n_examples`` test prompts greedily with ``decode.<p>``, as the evaluate stage
does, recording exact-match accuracy.

What a training seed varies: `TrainConfig.seed` seeds the global torch RNG before the weights are
built (`setdiff.initial.initial_weights`; it draws nothing when they are the AR model's) and the
training generator, which draws every batch (the data order) and the paradigm's training noise
(orders, masked positions, times); the held-out loss uses ``seed + 1``. The data, the AR model and
the test prompts stay fixed, so the spread is training variance alone. The decode's own sampler
seed stays at its default (greedy decoding draws nothing).

Cells are trained, scored and kept as `setdiff.retrain` does
(``results/seeds/<task>/<paradigm>-<seed>.json``; a re-run skips every finished cell whose
inputs are unchanged). ``metrics/seeds/<task>.json`` holds, per paradigm, the seeds and their
accuracies, mean, sample standard deviation, and the binomial standard error of one run's
accuracy at ``n_examples`` prompts (what the report's bootstrap CIs measure) for comparison. The
main run's accuracy (the recipe's seed, ``metrics/evaluate/<task>/<p>.json``) is joined by
the report.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from setdiff import retrain
from setdiff.artifacts import write_json
from setdiff.config import ConfigError
from setdiff.preset import load_preset
from setdiff.recipe import SeedStudyConfig, TaskTrainConfig
from setdiff.stages.common import Layout, parse_args, setup_logging
from setdiff.tasks import ANSWER_TASKS
from setdiff.train import TrainConfig


def main(argv: list[str]) -> None:
    args = parse_args(argv, "Seed variance: diffusion accuracy per training seed.", paradigm=False)
    setup_logging()
    preset = load_preset(args.params)
    study = preset.section("seeds", SeedStudyConfig)
    if args.task not in ANSWER_TASKS:
        raise ConfigError(
            f"--task: {args.task!r} has no answers to score; use {sorted(ANSWER_TASKS)}"
        )
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    steps = {} if study.steps is None else {"steps": study.steps}
    cells = [
        retrain.make_cell(
            preset,
            recipe,
            p,
            name=f"{p}-{s}",
            where=f"seeds (train.{args.task}, {p})",
            train={"seed": s, **steps},
        )
        for p in study.paradigms
        for s in study.seeds
    ]
    layout = Layout(args.root, args.task)
    data = retrain.load_data(preset, layout, recipe, study.n_examples)
    inputs = retrain.input_hashes(data)
    out_dir = Path(args.root) / "results" / "seeds" / args.task
    rows = [retrain.cached_run(out_dir, cell, data, inputs) for cell in cells]
    summary = {
        "task": args.task,
        "n_examples": len(data.records),
        "steps": study.steps,
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
    """Mean and sample standard deviation over seeds, beside one run's binomial standard error."""
    accuracies = [float(r["accuracy"]) for r in rows]
    mean = statistics.fmean(accuracies)
    return {
        "seeds": [r["seed"] for r in rows],
        "accuracies": accuracies,
        "n": len(accuracies),
        "mean": mean,
        "sd": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
        "binomial_se": math.sqrt(mean * (1 - mean) / n_examples),
        "steps": rows[0]["steps"],
        "recipe_seed": recipe.seed,
        "recipe_steps": recipe.steps,
    }
