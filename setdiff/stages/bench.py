"""DVC stage ``bench``: the speed-quality sweep of every paradigm on one answer task, batch 1.

``setdiff bench --task arith`` reads ``bench.run``, ``bench.sweep`` and ``decode``; decodes the
first ``n_examples`` test prompts with every paradigm and every configuration of its sweep (the
cartesian product of ``bench.sweep.<paradigm>`` over ``decode.<paradigm>``), and writes tidy rows
to ``results/bench/<task>.csv``, the decode traces (positions decoded per forward) to
``results/bench/<task>.traces.jsonl``, and ``results/bench/<task>.json`` (fingerprint and
configurations).

Side by side: for each example every configuration runs once, in a fixed order, so machine drift
hits all methods alike; warm-up examples (from the validation split) run every configuration
first and are not recorded. All configurations are validated before any compute.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any

import torch

from setdiff.artifacts import LoadedModel, load_model, run_id, write_json, write_text
from setdiff.config import ConfigError, check, frozen
from setdiff.data import read_records
from setdiff.evaluate import ANSWER_TASKS, score_answer
from setdiff.measure import (
    Row,
    count_new_tokens,
    fingerprint,
    kv_cache_mb,
    peak_memory_mb,
    reset_peak_memory,
    timed,
    write_rows,
)
from setdiff.params import Params, load_params
from setdiff.progress import progress_bar
from setdiff.sampling.loop import generate
from setdiff.sampling.policies import parse_threshold
from setdiff.stages.common import Layout, StudyConfig, parse_args, setup_logging

log = logging.getLogger(__name__)


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

    def __post_init__(self) -> None:
        check(self.n_examples >= 1, "n_examples must be >= 1")
        check(self.warmup >= 0, "warmup must be >= 0")
        check(self.threads >= 0, "threads must be >= 0")


@frozen
class Configuration:
    paradigm: str
    label: str
    options: Mapping[str, Any]


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


def measure(
    model: LoadedModel,
    config: Configuration,
    prompt: list[int],
    *,
    task: str,
    record: Mapping[str, Any],
    index: int,
    seq_len: int,
    seed: int,
    traces: list[dict[str, Any]] | None = None,
) -> Row:
    """Decode one prompt under one configuration; append its step trace to `traces` if given."""
    tok, device = model.tokenizer, next(model.net.parameters()).device
    reset_peak_memory(device)
    result, seconds = timed(
        lambda: generate(
            model,
            prompt,
            max_new_tokens=seq_len - len(prompt),
            stop_ids=[tok.eos_id],
            seed=seed,
            **config.options,
        ),
        device,
    )
    if traces is not None:
        traces.append(
            {
                "paradigm": config.paradigm,
                "config": config.label,
                "example": index,
                "prompt_tokens": len(prompt),
                "steps": result.steps,
            }
        )
    text = tok.decode(result.tokens)
    _, score = score_answer(task, text, record)
    threshold = parse_threshold(config.options.get("threshold"))
    window = config.options.get("window")
    return Row(
        task=task,
        paradigm=config.paradigm,
        engine="setdiff",
        config=config.label,
        window=window if isinstance(window, int) else None,
        threshold=threshold,
        regime="latency",
        concurrency=1,
        example=index,
        prompt_tokens=len(prompt),
        new_tokens=count_new_tokens(result.tokens, [tok.eos_id]),
        nfe=result.nfe,
        latency_s=seconds,
        forward_s=result.forward_seconds,
        peak_mem_mb=peak_memory_mb(device),
        kv_cache_mb=kv_cache_mb(model.net, result.cache_length),
        score=score,
        exact=float(score == 1.0),
        stopped=result.stopped,
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
    layout = Layout(args.root, args.task)
    if run.threads:
        torch.set_num_threads(run.threads)
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
    test = read_records(layout.raw / "test.jsonl", args.task)[: run.n_examples]
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
