"""One ablation trial, the only compute an Optuna trial runs: `run_trial` (the ``setdiff trial``
command's body, in a subprocess of the flow).

`resolve_trial` applies the sampled knob values to the preset's paradigm config and decode
options and validates both. When the spec ``trains`` (the space has training knobs) the trial
trains its paradigm from the train stage's starting weights (`setdiff.initial`) for
``budget.train_steps`` steps, logging the held-out loss to ``train_log.jsonl`` (the flow follows
it) and stopping early under the median rule (`setdiff.ablation.pruning`); the model is kept
under the cache folder keyed by its training config, so later trials with the same training
knobs only decode. Otherwise it loads ``models/<task>/<paradigm>``. It then decodes the first
``budget.n_examples`` test prompts as the bench stage does (`setdiff.measure.measure`) and writes
``result.json``: {accuracy, tokens_per_second, nfe_mean, tokens_per_forward, n, spec, ...}
(`summarize`, and `constraint_values` in Optuna's convention).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from setdiff.ablation.knobs import DEFAULT_PARADIGM, DIFFUSION, KNOBS, RETRAIN, resolve_multiple
from setdiff.ablation.pruning import Pruned, should_prune
from setdiff.ablation.spec import Bound, TrialSpec
from setdiff.artifacts import LoadedModel, load_model, run_id, save_model_dir
from setdiff.batching import ArraySplit
from setdiff.bench.config import BenchRunConfig
from setdiff.config import ConfigError, check, to_dict
from setdiff.files import finite_or_none, write_json
from setdiff.initial import initial_source, initial_weights, inputs_fingerprint
from setdiff.layout import TaskFiles
from setdiff.measure import Configuration, Row, measure
from setdiff.model import ModelConfig
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import Params
from setdiff.preset import ModelSpec, Preset
from setdiff.recipe import TaskTrainConfig
from setdiff.runtime import setup_torch
from setdiff.sampling.policies import decode_policy
from setdiff.tasks import read_records
from setdiff.tokenizer import load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class TrialPlan:
    """What one trial trains and decodes."""

    paradigm: str
    config: Any
    """The paradigm's config record (the preset's, with the training knobs applied)."""
    options: dict[str, Any]
    """Decode options (the preset's ``decode.<paradigm>``, with the decode knobs applied)."""


def resolve_trial(params: Params, knobs: Mapping[str, Any]) -> TrialPlan:
    """Apply knob values to the preset's paradigm config and decode options, and validate both.

    Raises:
        ConfigError: unknown knob, a knob that does not apply, or an invalid result (W > s_max,
            s_max < D, tau out of range, ...), naming the knob values.
    """
    name = knobs.get("paradigm", DEFAULT_PARADIGM)
    where = f"{params.path}: ablation trial {dict(knobs)}"
    if name not in DIFFUSION:
        raise ConfigError(f"{where}: paradigm must be one of {list(DIFFUSION)}")
    unknown = sorted(set(knobs) - set(KNOBS))
    stray = [k for k in knobs if k in KNOBS and name not in KNOBS[k].paradigms]
    if unknown or stray:
        raise ConfigError(f"{where}: unknown knob(s) {unknown}, not for {name}: {stray}")
    base = params.section(f"paradigm.{name}", PARADIGMS[name][0])
    train = {k: knobs[k] for k in RETRAIN if k in knobs}
    field = PARADIGMS[name][1].set_size_field  # D is `set_size` for setdlm, `block_size` for bd3lm
    if "set_size" in train and field != "set_size":
        train = {**{k: v for k, v in train.items() if k != "set_size"}, field: train["set_size"]}
    if "max_set_size" in train:
        train["max_set_size"] = resolve_multiple(
            train["max_set_size"], train.get("set_size", base.set_size)
        )
    options = dict(params.get_path(f"decode.{name}") or {})
    try:
        config = dataclasses.replace(base, **train)
        if knobs.get("order") == "any":
            options["window"] = "all"
        elif "window" in knobs:
            options["window"] = resolve_multiple(knobs["window"], config.set_size)
        if knobs.get("order") == "sliding" and options.get("window") == "all":
            raise ValueError("order 'sliding' needs a window: add window to the space")
        if "threshold" in knobs:
            options["threshold"] = knobs["threshold"]
        decode_policy(make_paradigm(name, config, mask_id=0), dict(options))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return TrialPlan(paradigm=name, config=config, options=options)


def summarize(rows: Sequence[Any]) -> dict[str, float]:
    """A trial's metrics from its `setdiff.measure.Row`s (one per decoded example)."""
    check(len(rows) > 0, "no rows to summarize")
    tokens = sum(r.new_tokens for r in rows)
    return {
        "accuracy": sum(r.exact for r in rows) / len(rows),
        "tokens_per_second": tokens / max(sum(r.latency_s for r in rows), 1e-9),
        "nfe_mean": sum(r.nfe for r in rows) / len(rows),
        "tokens_per_forward": tokens / max(sum(r.nfe for r in rows), 1),
        "n": len(rows),
    }


def constraint_values(
    summary: Mapping[str, float], constraints: Mapping[str, Bound]
) -> dict[str, float]:
    """Optuna's convention: one value per bound, feasible when <= 0."""
    out = {}
    for metric, bound in constraints.items():
        if bound.min is not None:
            out[f"{metric}_min"] = bound.min - summary[metric]
        if bound.max is not None:
            out[f"{metric}_max"] = summary[metric] - bound.max
    return out


def run_trial(
    preset: Preset, spec: TrialSpec, layout: TaskFiles, out: Path, cache: Path | None
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


def _checkpoint(plan: TrialPlan, layout: TaskFiles, run: BenchRunConfig) -> LoadedModel:
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
    layout: TaskFiles,
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
    layout: TaskFiles,
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
    model: LoadedModel, plan: TrialPlan, spec: TrialSpec, layout: TaskFiles, run: BenchRunConfig
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
