"""DVC stage ``bench``: the speed-quality sweep of every paradigm on one answer task, batch 1,
then the throughput sweep (batched decoding) of chosen configurations.

``setdiff bench --task arith`` reads ``bench.run``, ``bench.sweep`` and ``decode``; decodes the
first ``n_examples`` test prompts with every paradigm and every configuration of its sweep (the
cartesian product of ``bench.sweep.<paradigm>`` over ``decode.<paradigm>``), and writes tidy rows
to ``results/bench/<task>.csv``, the decode traces (positions decoded per forward) to
``results/bench/<task>.traces.jsonl``, and ``results/bench/<task>.json`` (fingerprint and
configurations).

Side by side: for each example every configuration runs once, in a fixed order, so machine drift
hits all methods alike; warm-up examples (from the validation split) run every configuration
first and are not recorded. All configurations are validated before any compute.

Throughput (``bench.run.throughput``): the chosen configurations and batched AR decode the first
``n_examples`` test prompts in batches of each size with `generate_batch`, under the same contract
(`setdiff.bench.throughput`); ``results/throughput/<task>.json`` holds tokens/s per method
and batch size (wall and CPU clocks), the ratio to batched AR, accuracy, and whether every row
equals the batch-1 decode. With no batch sizes the file says the sweep was off.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any

import torch

from setdiff.artifacts import LoadedModel, load_model, run_id, write_json, write_text
from setdiff.bench.throughput import Method, sweep
from setdiff.config import ConfigError, check, frozen
from setdiff.evaluate import ANSWER_TASKS
from setdiff.measure import Configuration, Row, fingerprint, measure, write_rows
from setdiff.params import Params, load_params
from setdiff.progress import progress_bar
from setdiff.runtime import setup_torch
from setdiff.stages.common import Layout, StudyConfig, parse_args, setup_logging
from setdiff.tasks import read_records

log = logging.getLogger(__name__)


@frozen
class ThroughputConfig:
    """The throughput regime: chosen configurations decoded in batches (`generate_batch`)."""

    batch_sizes: tuple[int, ...] = ()
    """Batch sizes to measure; empty = no throughput sweep (its JSON says so)."""
    n_examples: int = 32
    """Test prompts decoded at every batch size (the first ones)."""
    configs: tuple[str, ...] = ()
    """``"<paradigm> <label>"`` of `bench.sweep` configurations (labels as in the CSV, e.g.
    ``"setdlm threshold=0.9 window=2"``, ``"ar default"``); empty = the first configuration of
    every paradigm. Batched AR is always measured (the ratios are against it)."""

    def __post_init__(self) -> None:
        check(all(b >= 1 for b in self.batch_sizes), "batch_sizes must be >= 1")
        check(self.n_examples >= 1, "n_examples must be >= 1")


@frozen
class BenchRunConfig:
    n_examples: int = 200
    """Test prompts measured per configuration (the first ones)."""
    warmup: int = 3
    """Validation prompts run by every configuration first, not recorded."""
    seed: int = 0
    device: str = "cpu"
    threads: int = 1
    """torch intra-op threads (batch-1 decoding of small models is fastest and steadiest on 1)."""
    throughput: ThroughputConfig = ThroughputConfig()
    """The throughput sweep, run after the latency sweep (`setdiff.bench.throughput`)."""

    def __post_init__(self) -> None:
        check(self.n_examples >= 1, "n_examples must be >= 1")
        check(self.warmup >= 0, "warmup must be >= 0")
        check(self.threads >= 0, "threads must be >= 0")


def configurations(params: Params, paradigms: tuple[str, ...]) -> list[Configuration]:
    """Every (paradigm, decode options) of the sweep; ConfigError on an unknown knob."""
    sweep = params.get_path("bench.sweep")
    unknown = sorted(set(sweep) - set(paradigms))
    if unknown:
        raise ConfigError(f"{params.path}: bench.sweep: paradigms {unknown} are not in the study")
    out = []
    for name in paradigms:
        base = dict(params.get_path(f"decode.{name}") or {})
        grid = dict(sweep.get(name) or {})
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{params.path}: bench.sweep.{name}.{key}: need a non-empty list")
        keys = sorted(grid)
        for combo in itertools.product(*(grid[k] for k in keys)):
            chosen = dict(zip(keys, combo, strict=True))
            label = " ".join(f"{k}={v}" for k, v in chosen.items()) or "default"
            out.append(Configuration(paradigm=name, label=label, options={**base, **chosen}))
    return out


def throughput_configurations(
    configs: list[Configuration], chosen: tuple[str, ...], where: str
) -> list[Configuration]:
    """The configurations named in `chosen` (AR first, always), or every paradigm's first."""
    by_name = {f"{c.paradigm} {c.label}": c for c in configs}
    unknown = [name for name in chosen if name not in by_name]
    if unknown:
        raise ConfigError(
            f"{where}: bench.run.throughput.configs: {unknown} are not bench.sweep "
            f"configurations; known: {sorted(by_name)}"
        )
    if not chosen:
        firsts: dict[str, Configuration] = {}
        for c in configs:
            firsts.setdefault(c.paradigm, c)
        picked = list(firsts.values())
    else:
        picked = [by_name[name] for name in dict.fromkeys(chosen)]
    ar = next(c for c in configs if c.paradigm == "ar")
    return [ar] + [c for c in picked if c.paradigm != "ar" or c is not ar]


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


def main(argv: list[str]) -> None:
    args = parse_args(argv, "Speed-quality sweep of every paradigm on one task.", paradigm=False)
    setup_logging()
    params = load_params(args.params)
    run = params.section("bench.run", BenchRunConfig)
    study = params.section("study", StudyConfig)
    if args.task not in ANSWER_TASKS:
        raise ConfigError(
            f"bench: task {args.task!r} has no answers; use one of {list(ANSWER_TASKS)}"
        )
    configs = configurations(params, study.paradigms)
    batched = throughput_configurations(configs, run.throughput.configs, str(params.path))
    layout = Layout(args.root, args.task)
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
        models[config.paradigm].paradigm.decode_policy(dict(config.options))
    seq_len = models["ar"].net.config.max_seq_len
    tok = models["ar"].tokenizer
    all_test = read_records(layout.raw / "test.jsonl", args.task)
    test = all_test[: run.n_examples]
    warm = read_records(layout.raw / "valid.jsonl", args.task)[: run.warmup]
    rows: list[Row] = []
    traces: list[dict[str, Any]] = []
    for phase, records in (("warmup", warm), ("measure", test)):
        for i, record in enumerate(progress_bar(records, desc=f"bench {args.task} ({phase})")):
            prompt = [tok.bos_id] + tok.encode(record["prompt"])
            for config in configs:
                row = measure(
                    models[config.paradigm],
                    config,
                    prompt,
                    task=args.task,
                    record=record,
                    index=i,
                    seq_len=seq_len,
                    seed=run.seed,
                    traces=traces if phase == "measure" else None,
                )
                if phase == "measure":
                    rows.append(row)
    out = layout.root / "results" / "bench" / f"{args.task}.csv"
    write_rows(out, rows)
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
            "run": {"n_examples": len(test), "warmup": len(warm), "seed": run.seed},
            "fingerprint": fingerprint(
                torch.device(run.device),
                params_hash=run_id(params.get_path("bench"), params.get_path("decode")),
                checkpoints={n: layout.model(n) for n in study.paradigms},
            ),
        },
    )
    log.info("wrote %d rows to %s", len(rows), out)
