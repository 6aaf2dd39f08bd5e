"""Held-out likelihood bound / perplexity of one model; writes metrics/.

DVC stage ``evaluate`` (accuracy too, where the task has answers).

``setdiff evaluate --task arith --paradigm setdlm`` reads ``evaluate`` and ``decode.<paradigm>``,
loads ``models/<task>/<paradigm>``, and writes ``metrics/evaluate/<task>/<paradigm>.json``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from setdiff.batching import ArraySplit
from setdiff.evaluate import EvalConfig, answer_rows, check_finite_weights, likelihood
from setdiff.files import write_json, write_text
from setdiff.paradigm import PARADIGMS
from setdiff.sampling.policies import decode_policy
from setdiff.stages.common import start
from setdiff.tasks import ANSWER_TASKS, read_records

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("evaluate", "decode.{paradigm}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

THREADS = ("evaluate.threads",)
"""The params key of the threads it computes on (`flows.lanes` gives it as many cores)."""


def main(argv: list[str]) -> None:
    from setdiff.runtime import setup_torch

    args, preset, layout = start(
        argv, "Held-out likelihood (and answer accuracy) of one model.", paradigms=PARADIGMS
    )
    config = preset.section("evaluate", EvalConfig)
    decode_options: dict[str, Any] = preset.section(f"decode.{args.paradigm}")
    model = layout.load_model(config.device)
    decode_policy(model.paradigm, decode_options)  # validate the options before any compute
    check_finite_weights(model)  # NaN weights would give NaN metrics: refuse, write nothing
    setup_torch(threads=config.threads or None)
    test = ArraySplit.load(layout.encoded("test"))
    if int(test.tokens.max()) >= model.net.config.vocab_size:
        raise ValueError(
            f"{layout.encoded('test')} holds token id {int(test.tokens.max())} but "
            f"{layout.model()} has {model.net.config.vocab_size} embedding rows: another tokenizer"
        )
    lik = likelihood(
        model, test, batch_size=config.batch_size, seed=config.seed, limit=config.n_likelihood
    )
    metrics: dict[str, Any] = {
        "task": args.task,
        "paradigm": args.paradigm,
        "nll_per_token": lik.nll_per_token,
        "ppl": lik.ppl,
        "likelihood_is_exact": lik.is_exact,
        "n_tokens": lik.n_tokens,
        "n_sequences": lik.n_sequences,
    }
    rows: list[dict[str, Any]] = []
    if args.task in ANSWER_TASKS and config.n_answers > 0:
        records = read_records(layout.raw / "test.jsonl", args.task)[: config.n_answers]
        rows = answer_rows(
            model,
            records,
            task=args.task,
            seq_len=test.seq_len,
            decode_options={"seed": config.seed, **decode_options},
        )
        n = len(rows)
        new_tokens = sum(r["new_tokens"] for r in rows)
        metrics.update(
            {
                "accuracy": sum(r["exact"] for r in rows) / n,
                "score": sum(r["score"] for r in rows) / n,
                "n_answers": n,
                "tokens_per_forward": new_tokens / sum(r["nfe"] for r in rows),
                "tokens_per_second": new_tokens / sum(r["seconds"] for r in rows),
                "decode_options": decode_options,
            }
        )
    log.info(
        "%s/%s: %s",
        args.task,
        args.paradigm,
        {k: v for k, v in metrics.items() if isinstance(v, float)},
    )
    samples = layout.metrics("evaluate").with_suffix(".samples.jsonl")
    write_text(samples, "".join(json.dumps(r) + "\n" for r in rows[:20]))
    write_json(layout.metrics("evaluate"), metrics)
