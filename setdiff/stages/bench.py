"""Speed-quality sweep of every paradigm on one answer task (batch 1); results/.

DVC stage ``bench``: the speed-quality sweep of every paradigm on one answer task, batch 1,
then the throughput sweep (batched decoding) of chosen configurations.

``setdiff bench --task arith`` reads ``bench.run``, ``bench.sweep`` and ``decode``; decodes the
first ``n_examples`` test prompts with every paradigm and every configuration of its sweep (the
cartesian product of ``bench.sweep.<paradigm>`` over ``decode.<paradigm>``), and writes tidy rows
to ``results/bench/<task>.csv``, the decode traces (positions decoded per forward) to
``results/bench/<task>.traces.jsonl``, and ``results/bench/<task>.json`` (fingerprint and
configurations). With ``bench.run.n_select`` > 0 the first validation prompts are measured
too (after the warm-up, which runs the first ones unrecorded), into
``results/bench/<task>.select.csv`` (empty otherwise): the tradeoff stage chooses its operating
points there, so the test prompts only measure them.

Side by side: for each example every configuration runs once, in a fixed order, so machine drift
hits all methods alike; warm-up examples (from the validation split) run every configuration
first and are not recorded. All configurations are validated before any compute.

Throughput (``bench.run.throughput``): the chosen configurations and batched AR decode the first
``n_examples`` test prompts in batches of each size with `generate_batch`, under the same contract
(`setdiff.bench.throughput`); ``results/throughput/<task>.json`` holds tokens/s per method
and batch size (wall and CPU clocks), the ratio to batched AR, accuracy, and whether every row
equals the batch-1 decode. With ``transformers: true`` transformers' batched greedy AR (the AR
model exported to HF) runs in the same interleaved sweep, and ``against_best_ar`` gives each
method's ratio to the fastest AR engine at every batch size and the crossover batch size (the
first where that ratio falls below 1). With no batch sizes the file says the sweep was off.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from setdiff.artifacts import LoadedModel, load_model
from setdiff.bench.config import (
    BenchRunConfig,
    ThroughputConfig,
    configurations,
    throughput_configurations,
)
from setdiff.bench.throughput import Method, against_best_ar, sweep
from setdiff.config import ConfigError
from setdiff.files import write_json, write_text
from setdiff.measure import Configuration, Row, fingerprint, measure, write_rows
from setdiff.paradigm import make_paradigm
from setdiff.preset import Preset
from setdiff.progress import progress_bar
from setdiff.runtime import setup_torch
from setdiff.sampling.policies import check_decode, decode_policy
from setdiff.stages.common import start
from setdiff.study import StudyConfig
from setdiff.tasks import ANSWER_TASKS, read_records

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("bench.run", "bench.sweep", "decode", "study")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

SECTION = "bench"
"""The params section this stage owns (`check_preset` validates it)."""
THREADS = ("bench.run.threads",)
"""The params key of the threads it computes on (`flows.lanes` gives it as many cores)."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`) of ``bench`` (required): its tasks are study tasks
    with answers, each configuration of its sweep (and of the throughput sweep) builds a decode
    policy, and ``n_select`` fits each task's validation split."""
    path = str(preset.path)
    run = preset.section("bench.run", BenchRunConfig)
    configs = configurations(preset.bench_sweep, preset.decode, study.paradigms, path)
    throughput_configurations(configs, run.throughput.configs, path)
    for task in preset.bench_tasks:
        if task not in study.tasks or task not in ANSWER_TASKS:
            raise ConfigError(
                f"{path}: bench.tasks: {task!r} must be a study task with "
                f"answers ({sorted(ANSWER_TASKS)})"
            )
        preset.check_counts(task, "bench.run", run, (("n_select", "valid"),))
    for config in configs:
        where = f"bench.sweep.{config.paradigm} ({config.label})"
        paradigm = make_paradigm(config.paradigm, preset.paradigm(config.paradigm), mask_id=0)
        check_decode(paradigm, config.options, f"{path}: {where}")


def run_throughput(
    models: Mapping[str, LoadedModel],
    configs: list[Configuration],
    spec: ThroughputConfig,
    *,
    task: str,
    test: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    seq_len: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Figures of the throughput sweep (empty when `spec.batch_sizes` is)."""
    if not spec.batch_sizes:
        return []
    methods = [Method(c.paradigm, c.label, models[c.paradigm], dict(c.options)) for c in configs]
    if spec.transformers:
        from setdiff.baselines.hf_engine import load_hf_model  # transformers: imported late
        from setdiff.hf import export_hf

        with tempfile.TemporaryDirectory() as tmp:  # loaded into memory, then the files go
            hf = load_hf_model(export_hf(models["ar"].path, Path(tmp) / "ar-hf"))
        methods.insert(1, Method("ar", "transformers", models["ar"], {}, engine=hf))
    log.info("throughput: batch sizes %s, %d methods", list(spec.batch_sizes), len(methods))
    return sweep(
        methods,
        test[: spec.n_examples],
        warm,
        spec.batch_sizes,
        task=task,
        seq_len=seq_len,
        seed=seed,
    )


def measure_all(
    models: Mapping[str, LoadedModel],
    configs: list[Configuration],
    warm: list[dict[str, Any]],
    test: list[dict[str, Any]],
    *,
    task: str,
    seed: int,
    select: Sequence[dict[str, Any]] = (),
) -> tuple[list[Row], list[dict[str, Any]], list[Row]]:
    """Every configuration on every prompt, interleaved per prompt (the warm-up prompts run
    first and are not recorded); the rows and decode traces of the test prompts, and the rows
    of the `select` (validation) prompts."""
    seq_len = models["ar"].net.config.max_seq_len
    tok = models["ar"].tokenizer
    rows: list[Row] = []
    selected: list[Row] = []
    traces: list[dict[str, Any]] = []
    phases = (("warmup", warm, None), ("select", select, selected), ("measure", test, rows))
    for phase, records, out in phases:
        for i, record in enumerate(progress_bar(records, desc=f"bench {task} ({phase})")):
            prompt = [tok.bos_id] + tok.encode(record["prompt"])
            for config in configs:
                row = measure(
                    models[config.paradigm],
                    config,
                    prompt,
                    task=task,
                    record=record,
                    index=i,
                    seq_len=seq_len,
                    seed=seed,
                    traces=traces if phase == "measure" else None,
                )
                if out is not None:
                    out.append(row)
    return rows, traces, selected


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Speed-quality sweep of every paradigm on one task.", answers=True
    )
    run = preset.section("bench.run", BenchRunConfig)
    study = preset.section("study")
    configs = configurations(
        preset.section("bench.sweep"), preset.decode, study.paradigms, str(preset.path)
    )
    batched = throughput_configurations(configs, run.throughput.configs, str(preset.path))
    setup_torch(threads=run.threads or None)
    models = {
        name: load_model(
            layout.model(name),
            run.device,
            paradigm=name,
            task=args.task,
            tokenizer=layout.tokenizer,
        )
        for name in study.paradigms
    }
    for config in configs:  # validate every option set before any compute
        decode_policy(models[config.paradigm].paradigm, dict(config.options))
    seq_len = models["ar"].net.config.max_seq_len
    all_test = read_records(layout.raw / "test.jsonl", args.task)
    test = all_test[: run.n_examples]
    valid = read_records(layout.raw / "valid.jsonl", args.task)
    warm, select = valid[: run.warmup], valid[: run.n_select]
    if len(select) < run.n_select:
        raise ConfigError(
            f"{preset.path}: bench.run.n_select={run.n_select}: the validation split holds "
            f"only {len(valid)} prompts"
        )
    rows, traces, selected = measure_all(
        models, configs, warm, test, task=args.task, seed=run.seed, select=select
    )
    out = layout.root / "results" / "bench" / f"{args.task}.csv"
    write_rows(out, rows)
    write_rows(out.with_suffix(".select.csv"), selected)
    write_text(out.with_suffix(".traces.jsonl"), "".join(json.dumps(t) + "\n" for t in traces))
    figures = run_throughput(
        models,
        batched,
        run.throughput,
        task=args.task,
        test=all_test,
        warm=warm,
        seq_len=seq_len,
        seed=run.seed,
    )
    write_json(
        layout.root / "results" / "throughput" / f"{args.task}.json",
        {
            "task": args.task,
            "batch_sizes": list(run.throughput.batch_sizes),
            "methods": [f"{c.paradigm} {c.label}" for c in batched],
            "figures": figures,
            "against_best_ar": against_best_ar(figures),
        },
    )
    write_json(
        out.with_suffix(".json"),
        {
            "task": args.task,
            "configurations": [
                {"paradigm": c.paradigm, "config": c.label, "options": dict(c.options)}
                for c in configs
            ],
            "run": {
                "n_examples": len(test),
                "warmup": len(warm),
                "n_select": len(select),
                "seed": run.seed,
            },
            "fingerprint": fingerprint(
                torch.device(run.device),
                params_hash=preset.digest("bench", "decode"),
                checkpoints={n: layout.model(n) for n in study.paradigms},
            ),
        },
    )
    log.info("wrote %d rows to %s", len(rows), out)
