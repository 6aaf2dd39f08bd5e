"""Validation answer accuracy at each evaluation of a training run (its curve); metrics/.

``setdiff curve --task arith --paradigm setdlm`` reads ``train.<task>`` (its ``curve`` section:
how many validation prompts, decoded how; the recipe's device and threads), decodes the first
``curve.n_examples`` validation prompts greedily with each snapshot of
``snapshots/<task>/<paradigm>/`` (the weights the train stage evaluated at each evaluation, EMA
when on), and writes ``metrics/curve/<task>/<paradigm>.json``: one point per evaluation, so a
reader of the training curves sees whether a paradigm had converged. Decoding here rather than
inside training keeps the sampler out of the train stage's dependencies: a sampler edit re-runs
this stage, not the training. The decode runs on the recipe's threads, as training does, so
its numerics are those of the training process.
"""

from __future__ import annotations

import json
import logging

from setdiff.artifacts import load_weights
from setdiff.config import ConfigError
from setdiff.evaluate import SCORING_BATCH, answer_rows
from setdiff.files import write_json
from setdiff.paradigm import PARADIGMS
from setdiff.recipe import TaskTrainConfig
from setdiff.runtime import setup_torch
from setdiff.sampling.policies import check_decode
from setdiff.stages.common import snapshot_name, start
from setdiff.tasks import ANSWER_TASKS, read_records

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("train.{task}",)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Validation accuracy at every evaluation of a training run.", paradigms=PARADIGMS
    )
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    curve, config = recipe.curve, recipe.for_paradigm(args.paradigm)
    where = f"{preset.path}: train.{args.task}.curve"
    if curve.n_examples and args.task not in ANSWER_TASKS:
        raise ConfigError(f"{where}.n_examples: task {args.task!r} has no answers to score")
    options = dict(curve.decode.get(args.paradigm, {}))
    model = layout.load_model(config.device)
    check_decode(model.paradigm, options, f"{where}.decode.{args.paradigm}")
    manifest = layout.snapshots / "steps.json"
    try:
        steps = [int(step) for step in json.loads(manifest.read_text())]
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{manifest}: no readable list of snapshot steps ({err})") from None
    records = [] if not curve.n_examples else read_records(layout.raw / "valid.jsonl", args.task)
    records = records[: curve.n_examples]
    setup_torch(config.device, threads=config.threads or None)
    points = []
    for step in steps if records else []:
        load_weights(model.net, layout.snapshots / snapshot_name(step))
        rows = answer_rows(
            model,
            records,
            task=args.task,
            seq_len=model.net.config.max_seq_len,
            decode_options=options,
            show_progress=False,
            batch_size=SCORING_BATCH,
        )
        points.append({"step": step, "accuracy": sum(r["exact"] for r in rows) / len(rows)})
        log.info(
            "%s/%s step %d: accuracy %.3f", args.task, args.paradigm, step, points[-1]["accuracy"]
        )
    write_json(
        layout.metrics("curve"),
        {
            "task": args.task,
            "paradigm": args.paradigm,
            "n_examples": len(records),
            "decode": options,
            "points": points,
        },
    )
