"""``setdiff trial``: one ablation trial, the only compute an Optuna trial runs (a subprocess).

``setdiff trial --task arith --spec trial.json --out DIR [--cache DIR]`` reads the preset's
``paradigm``, ``decode``, ``train.<task>``, ``model.<task>`` and ``bench.run`` plus the trial spec
that ``flows/ablation.py`` writes (`setdiff.ablation.TrialSpec`)::

    {"study", "number", "knobs": {...}, "trains": bool, "budget": {...},
     "prune": {"peers", "min_trials", "warmup_steps", "group_by"} | null, "constraints": {...}}

When ``trains`` (the space has training knobs) it trains the trial's paradigm from the train
stage's starting weights (`setdiff.initial`: ``models/<task>/ar`` under ``init_from_ar``, else
``model.<task>.pretrained``, else random) for ``budget.train_steps`` steps, logging the
held-out loss to ``DIR/train_log.jsonl`` (the flow follows it) and stopping early under the
median rule of `setdiff.ablation.should_prune`; the model is kept under ``--cache`` keyed by its
training config, so later trials with the same training knobs only decode. Otherwise it loads
``models/<task>/<paradigm>``. It then decodes the first ``budget.n_examples`` test prompts as the
bench stage does (`setdiff.measure.measure`) and writes ``DIR/result.json``:
{accuracy, tokens_per_second, nfe_mean, tokens_per_forward, n, spec, ...}.

``setdiff trial --task arith --space FILE`` validates the preset's ``ablation`` section and writes
the resolved search space that the flow samples from; the flow runs it before any trial.

Exit status 2 = a configuration or value error (never worth a retry); the flow treats any other
failure (killed, crashed) as an infrastructure fault.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setdiff.ablation import (
    TrialPlan,
    TrialSpec,
    constraint_values,
    resolve_trial,
    should_prune,
    summarize,
)
from setdiff.artifacts import LoadedModel, load_model, run_id, save_model_dir
from setdiff.batching import ArraySplit
from setdiff.bench.config import BenchRunConfig
from setdiff.config import ConfigError, build, to_dict
from setdiff.files import finite_or_none, write_json
from setdiff.initial import initial_source, initial_weights, inputs_fingerprint
from setdiff.measure import Configuration, Row, measure
from setdiff.model import ModelConfig
from setdiff.paradigm import make_paradigm
from setdiff.preset import ModelSpec, Preset, load_preset
from setdiff.recipe import TaskTrainConfig
from setdiff.runtime import setup_torch
from setdiff.search import resolve_space
from setdiff.stages.common import Layout, setup_logging
from setdiff.tasks import check_task, read_records
from setdiff.tokenizer import load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
"""Exit status of a configuration/value error (argparse uses it for usage errors too)."""


class Pruned(Exception):
    """Raised from the training callback when the median rule stops a trial."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"pruned at step {step} (held-out loss {loss:.4f})")
        self.step, self.loss = step, loss


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


def run_trial(
    preset: Preset, spec: TrialSpec, layout: Layout, out: Path, cache: Path | None
) -> dict[str, Any]:
    """Train (or load), decode, and write ``out/result.json``; returns the result record."""
    started = time.perf_counter()
    run = preset.section("bench.run", BenchRunConfig)
    plan = resolve_trial(preset.params, spec.knobs)
    setup_torch(threads=run.threads or None)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "spec": to_dict(spec),
        "paradigm": plan.paradigm,
        "paradigm_config": to_dict(plan.config),
        "decode_options": plan.options,
        "pruned": False,
    }
    try:
        if spec.trains:
            model, record["train"] = _trained_model(preset, plan, spec, layout, out, cache, run)
        else:
            model, record["train"] = _checkpoint(plan, layout, run), None
    except Pruned as stop:
        record.update(pruned=True, pruned_at=stop.step, eval_loss=stop.loss)
        record["train"] = {"curve": _curve(out / "train_log.jsonl")}
    else:
        rows = _decode(model, plan, spec, layout, run)
        summary = summarize(rows)
        record.update(summary, constraints=constraint_values(summary, spec.constraints))
    record["seconds"] = round(time.perf_counter() - started, 3)
    write_json(out / "result.json", finite_or_none(record))  # a NaN loss (pruned): null
    log.info("trial %s done in %.1f s", spec.number, record["seconds"])
    return record


def _checkpoint(plan: TrialPlan, layout: Layout, run: BenchRunConfig) -> LoadedModel:
    """Decode-time trials reuse the pipeline's trained model, which must match the preset."""
    path = layout.model(plan.paradigm)
    if not (path / "config.json").exists():
        raise ConfigError(f"{path}: no trained model; run `dvc repro` (train stages) first")
    expect = {"paradigm": plan.paradigm, "task": layout.task, "tokenizer": layout.tokenizer}
    model = load_model(path, device=run.device, **expect)
    if to_dict(model.paradigm.config) != to_dict(plan.config):
        raise ConfigError(
            f"{path} was trained with {to_dict(model.paradigm.config)} but the preset says "
            f"{to_dict(plan.config)}; run `dvc repro` first"
        )
    return model


def _trained_model(
    preset: Preset,
    plan: TrialPlan,
    spec: TrialSpec,
    layout: Layout,
    out: Path,
    cache: Path | None,
    run: BenchRunConfig,
) -> tuple[LoadedModel, dict[str, Any]]:
    """Train the trial's paradigm at the reduced budget (or reuse the cached result)."""
    recipe: TaskTrainConfig = preset.section(f"train.{layout.task}", TaskTrainConfig)
    steps = spec.budget.train_steps
    # Trials share the cores (ablation workers): each trains on bench.run's threads.
    config = dataclasses.replace(
        recipe.for_paradigm(plan.paradigm),
        steps=steps,
        eval_every=min(spec.budget.eval_every, steps),
        checkpoint_every=steps,
        threads=run.threads,
    )
    tokenizer = load_tokenizer(layout.tokenizer)
    splits = (ArraySplit.load(layout.encoded("train")), ArraySplit.load(layout.encoded("valid")))
    model_spec: ModelSpec = preset.section(f"model.{layout.task}")
    net_config = model_spec.config(tokenizer.vocab_size, splits[0].seq_len)
    # The train stage's rule: the AR model, else model.<task>.pretrained, else random weights.
    init = initial_source(
        plan.paradigm,
        init_from_ar=recipe.init_from_ar,
        ar_model=layout.model("ar"),
        pretrained=model_spec.pretrained,
    )
    # Keyed by every input of the weights: configs, data, tokenizer and starting weights.
    inputs = inputs_fingerprint(*splits, layout.tokenizer, init)
    key = run_id(plan.paradigm, net_config, plan.config, config, str(init), inputs)
    directory = (cache / key) if cache is not None else out / "model"
    # Parallel trials with the same training knobs: one trains, the others wait and reuse it.
    with _exclusive(directory.with_name(f".{key}.lock")):
        if (directory / "model.safetensors").exists():
            shutil.copyfile(directory / "train_log.jsonl", out / "train_log.jsonl")
            expect = {"paradigm": plan.paradigm, "task": layout.task, "tokenizer": layout.tokenizer}
            model = load_model(directory, device=run.device, **expect)
            return model, {"cached": True, "run_id": key, "curve": _curve(out / "train_log.jsonl")}
        return _train(
            plan, spec, layout, out, directory, config, init, key, run, net_config, splits
        )


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An advisory lock file (flock): released when the holder exits, even when killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _train(
    plan: TrialPlan,
    spec: TrialSpec,
    layout: Layout,
    out: Path,
    directory: Path,
    config: TrainConfig,
    init: Path | str | None,
    key: str,
    run: BenchRunConfig,
    net_config: ModelConfig,
    splits: tuple[ArraySplit, ArraySplit],
) -> tuple[LoadedModel, dict[str, Any]]:
    """Train from `init` with the median-rule pruning callback; save to `directory`."""
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split, valid_split = splits
    log_path = out / "train_log.jsonl"
    net = initial_weights(net_config, config.seed, init, layout.task, layout.tokenizer)
    paradigm = make_paradigm(plan.paradigm, plan.config, mask_id=tokenizer.mask_id)
    prune = spec.prune

    def on_eval(step: int, loss: float) -> None:
        if prune is not None and should_prune(
            step,
            loss,
            spec.knobs,
            prune.peers,
            min_trials=prune.min_trials,
            warmup_steps=prune.warmup_steps,
            group_by=prune.group_by,
        ):
            raise Pruned(step, loss)

    result = train(
        net,
        paradigm,
        train_split,
        valid_split,
        config,
        log_path=log_path,
        on_eval=on_eval,
        show_progress=False,
    )
    save_model_dir(
        directory,
        net,
        paradigm,
        tokenizer_file=layout.tokenizer,
        state_dict=result.weights,
        extra={"task": layout.task, "run_id": key, "init_from": str(init) if init else None},
        extra_files={"train_log.jsonl": log_path},
    )
    # Decode from the saved directory so a fresh and a cached model decode identically.
    model = load_model(directory, device=run.device)
    training = {"cached": False, "run_id": key, "steps": result.steps, "curve": _curve(log_path)}
    return model, {**training, "seconds": round(result.seconds, 2)}


def _curve(log_path: Path) -> list[list[float]]:
    if not log_path.exists():
        return []
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return [[line["step"], line["eval_loss"]] for line in lines]


def _decode(
    model: LoadedModel, plan: TrialPlan, spec: TrialSpec, layout: Layout, run: BenchRunConfig
) -> list[Row]:
    """The bench stage's measurement of one configuration (warm-up prompts not recorded)."""
    tok = model.tokenizer
    configuration = Configuration(paradigm=plan.paradigm, label=spec.label(), options=plan.options)
    test = read_records(layout.raw / "test.jsonl", layout.task)[: spec.budget.n_examples]
    warm = read_records(layout.raw / "valid.jsonl", layout.task)[: run.warmup]
    rows = []
    for phase, records in (("warmup", warm), ("measure", test)):
        for i, record in enumerate(records):
            prompt = [tok.bos_id] + tok.encode(record["prompt"])
            row = measure(
                model,
                configuration,
                prompt,
                task=layout.task,
                record=record,
                index=i,
                seq_len=model.net.config.max_seq_len,
                seed=run.seed,
            )
            if phase == "measure":
                rows.append(row)
    return rows
