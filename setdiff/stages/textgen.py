"""Text quality: verse infilling and unconditional generation of one model.

DVC stage ``textgen``.

``setdiff textgen --task text --paradigm setdlm`` reads ``textgen`` and ``decode.<paradigm>``,
loads ``models/<task>/<paradigm>`` and the judge ``models/<task>/ar``, and writes
``results/textgen/<task>/<paradigm>.csv`` (one `setdiff.measure.Row` per recorded example, with
``config`` = ``infill`` or ``uncond``) and ``metrics/textgen/<task>/<paradigm>.json``.
Infilling decodes with ``decode.<paradigm>`` as given (greedy by default); the unconditional
samples use it with ``textgen.temperature`` / ``top_p`` on top.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from setdiff.artifacts import LoadedModel, load_model, run_id
from setdiff.config import ConfigError
from setdiff.files import finite_or_none, write_json
from setdiff.measure import Row, count_new_tokens, fingerprint, kv_cache_mb, write_rows
from setdiff.paradigm import PARADIGMS
from setdiff.preset import Preset
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import GenerateResult
from setdiff.sampling.policies import decode_policy, parse_threshold
from setdiff.stages.common import Layout, start
from setdiff.study import StudyConfig
from setdiff.tasks import TASK_LAYOUTS, read_records
from setdiff.textgen import (
    InfillResult,
    Sample,
    TextGenConfig,
    distinct_n,
    generative_perplexity,
    infill,
    infill_examples,
    repetition_rate,
    token_nll,
    unconditional,
    unigram_entropy,
    with_sampling,
)
from setdiff.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("textgen", "decode.{paradigm}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

SECTION = "textgen"
"""The params section this stage owns (`check_preset` validates it)."""
THREADS = ("textgen.threads",)
"""The params key of the threads it computes on (`flows.lanes` gives it as many cores)."""
STUDY = "textgen"
"""``study.textgen``: the tasks this stage runs on (``textgen@<task>-<paradigm>``)."""
STUDY_TASKS = "stream"
"""Only text (stream) tasks."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``textgen`` builds when ``study.textgen`` lists
    a task (and is then required)."""
    if study.tasks_for("textgen"):
        preset.section("textgen", TextGenConfig)


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Text quality: verse infilling and unconditional generation.", paradigms=PARADIGMS
    )
    config = preset.section("textgen", TextGenConfig)
    base: dict[str, Any] = preset.section(f"decode.{args.paradigm}")
    if TASK_LAYOUTS[args.task] != "stream":
        raise ConfigError(f"textgen needs a text task, got {args.task!r}")
    setup_torch(threads=config.threads or None)
    expect = {"task": args.task, "tokenizer": layout.tokenizer}
    model = load_model(layout.model(), config.device, paradigm=args.paradigm, **expect)
    judge = model
    if args.paradigm != "ar":
        judge = load_model(layout.model("ar"), config.device, paradigm="ar", **expect)
    tokenizer = _check_models(model, judge, config)
    sampling = with_sampling(model, base, temperature=config.temperature, top_p=config.top_p)
    verses = read_records(layout.raw / "test.jsonl", args.task)
    infills = _run_infill(model, judge, tokenizer, verses, config, base)
    samples = unconditional(
        model,
        n_samples=config.warmup + config.n_uncond,
        max_new_tokens=config.uncond_tokens,
        seed=config.seed,
        decode_options=sampling,
    )[config.warmup :]
    bos = tokenizer.bos_id
    uncond_nll = token_nll(judge, [s.tokens for s in samples], bos)
    rows = _rows(layout, model, base, infills, samples, uncond_nll, tokenizer.eos_id)
    device = torch.device(config.device)
    metrics = {
        "task": args.task,
        "paradigm": args.paradigm,
        "decode_options": base,
        "uncond_decode_options": sampling,
        **_infill_metrics(infills, judge, bos),
        **_uncond_metrics(samples, uncond_nll),
        "fingerprint": fingerprint(
            device,
            params_hash=run_id(config, base),
            checkpoints={"model": layout.model(), "judge": layout.model("ar")},
        ),
    }
    log.info("%s/%s: %s", args.task, args.paradigm, _numbers(metrics))
    write_rows(layout.root / "results" / "textgen" / args.task / f"{args.paradigm}.csv", rows)
    write_json(layout.metrics("textgen"), finite_or_none(metrics))


def _check_models(model: LoadedModel, judge: LoadedModel, config: TextGenConfig) -> Tokenizer:
    """The shared tokenizer, after checking the judge fits the model and the budget fits."""
    if model.tokenizer is None or judge.tokenizer is None:
        raise ValueError(f"{model.path} and {judge.path} must both hold a tokenizer.json")
    if model.tokenizer.to_str() != judge.tokenizer.to_str():
        raise ValueError(f"{model.path} and the judge {judge.path} use different tokenizers")
    limit = model.net.config.max_seq_len - 1
    if config.uncond_tokens > limit:
        raise ConfigError(
            f"textgen.uncond_tokens={config.uncond_tokens} exceeds the model's room after <bos> "
            f"({limit})"
        )
    return model.tokenizer


def _run_infill(
    model: LoadedModel,
    judge: LoadedModel,
    tokenizer: Tokenizer,
    verses: list[dict[str, Any]],
    config: TextGenConfig,
    options: dict[str, Any],
) -> list[InfillResult]:
    """Infill warm-up + n_infill drawn triples; the warm-up results are dropped."""
    examples = infill_examples(
        verses,
        tokenizer,
        config.warmup + config.n_infill,
        config.seed,
        min(model.net.config.max_seq_len, judge.net.config.max_seq_len),
        context_tokens=config.infill_context,
    )
    results = [
        infill(model, example, decode_options=options, seed=config.seed + i)
        for i, example in enumerate(examples)
    ]
    return results[config.warmup :]


def _rows(
    cell: Layout,
    model: LoadedModel,
    options: dict[str, Any],
    infills: list[InfillResult],
    samples: list[Sample],
    nlls: list[np.ndarray],
    eos_id: int,
) -> list[Row]:
    """One measurement-contract row per recorded decode: ``infill`` then ``uncond`` rows."""
    policy = decode_policy(model.paradigm, dict(options))
    fields = dataclasses.asdict(policy)
    window = fields.get("window")
    row = functools.partial(
        Row,
        task=cell.task,
        paradigm=cell.paradigm,
        engine="setdiff",
        window=window if isinstance(window, int) else None,
        threshold=parse_threshold(fields.get("threshold")),
        regime="latency",
        concurrency=1,
    )

    def measured(g: GenerateResult, stop_ids: tuple[int, ...]) -> dict[str, Any]:
        return {
            "new_tokens": count_new_tokens(g.tokens, stop_ids),
            "nfe": g.nfe,
            "forward_s": g.forward_seconds,
            "kv_cache_mb": kv_cache_mb(model.net, g.cache_length) if policy.uses_cache else None,
            "stopped": g.stopped,
        }

    rows = [
        row(
            config="infill",
            example=i,
            prompt_tokens=r.prompt_tokens,
            latency_s=r.latency_s,
            peak_mem_mb=r.peak_mem_mb,
            score=r.rouge_l,
            exact=r.exact,
            **measured(r.generation, ()),
        )
        for i, r in enumerate(infills)
    ]
    for i, (sample, nll) in enumerate(zip(samples, nlls, strict=True)):
        rows.append(
            row(
                config="uncond",
                example=i,
                prompt_tokens=1,
                latency_s=sample.latency_s,
                peak_mem_mb=sample.peak_mem_mb,
                score=float(nll.mean()) if nll.size else math.nan,
                exact=math.nan,
                **measured(sample.generation, (eos_id,)),
            )
        )
    return rows


def _throughput(prefix: str, generations: Sequence[Any], seconds: Sequence[float]) -> dict:
    new_tokens = sum(len(g.tokens) for g in generations)
    return {
        f"{prefix}_tokens_per_second": new_tokens / sum(seconds),
        f"{prefix}_tokens_per_forward": new_tokens / sum(g.nfe for g in generations),
    }


def _infill_metrics(results: list[InfillResult], judge: LoadedModel, bos: int) -> dict:
    """ROUGE-L, exact match, and the judge's NLL of left+middle+right per middle token."""
    filled = [r.example.left + r.generation.tokens + r.example.right for r in results]
    truth = [r.example.left + r.example.middle + r.example.right for r in results]
    n_middle = sum(len(r.example.middle) for r in results)

    def per_middle_token(sequences: list[list[int]]) -> float:
        return float(sum(x.sum() for x in token_nll(judge, sequences, bos))) / n_middle

    return {
        "n_infill": len(results),
        "uses_right_context": results[0].uses_right_context,
        "infill_rouge_l": float(np.mean([r.rouge_l for r in results])),
        "infill_exact": float(np.mean([r.exact for r in results])),
        "infill_judge_nll": per_middle_token(filled),
        "infill_judge_nll_reference": per_middle_token(truth),
        "infill_middle_tokens": n_middle / len(results),
        **_throughput("infill", [r.generation for r in results], [r.latency_s for r in results]),
    }


def _uncond_metrics(samples: list[Sample], nlls: list[np.ndarray]) -> dict:
    tokens = [s.tokens for s in samples]
    gen_ppl = generative_perplexity(nlls)
    return {
        "n_uncond": len(samples),
        "uncond_gen_ppl": gen_ppl,
        "uncond_judge_nll": math.log(gen_ppl),
        "uncond_unigram_entropy": float(np.nanmean([unigram_entropy(t) for t in tokens])),
        **{f"uncond_distinct_{n}": distinct_n(tokens, n) for n in (1, 2, 3)},
        "uncond_repetition_rate_4": repetition_rate(tokens, 4),
        "uncond_mean_length": float(np.mean([s.new_tokens for s in samples])),
        "uncond_stopped_share": float(np.mean([s.generation.stopped for s in samples])),
        **_throughput("uncond", [s.generation for s in samples], [s.latency_s for s in samples]),
    }


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
