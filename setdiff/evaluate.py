"""Held-out likelihood and answer accuracy of one model. Pure: records and tensors in, rows out.

- `likelihood`: corpus NLL per token = sum NLL / sum target tokens, with the paradigm's own
  training forward (one sampled order or noise level per sequence, fixed seed). Exact for AR;
  an upper bound (NELBO / order-specific AR NLL) for the others. PPL = exp of it.
- `answer_rows`: greedy (or configured) decoding of each prompt with the paradigm's sampler,
  scored with the task generator's own checker; one row per example with the token accounting
  (new tokens up to and including EOS, NFE, forward seconds); batched (`generate_batch`, the
  same rows) where only the scores are wanted.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from setdiff.artifacts import LoadedModel
from setdiff.batching import ArraySplit
from setdiff.config import Device, Seed, Threads, check, frozen
from setdiff.progress import progress_bar
from setdiff.sampling.loop import generate, generate_batch
from setdiff.tasks import ANSWER_TASKS


@frozen
class EvalConfig:
    n_likelihood: int = 500
    """Test sequences scored for the likelihood bound (the first ones)."""
    n_answers: int = 200
    """Test prompts decoded and scored (tasks with answers only)."""
    batch_size: int = 64
    seed: Seed = 0
    """Seed of the order/noise sampled per sequence and of the sampler."""
    threads: Threads = 0
    """torch intra-op threads; 0 = torch's default."""
    device: Device = "cpu"

    def __post_init__(self) -> None:
        check(self.n_likelihood >= 1, "n_likelihood must be >= 1")
        check(self.n_answers >= 0, "n_answers must be >= 0")
        check(self.batch_size >= 1, "batch_size must be >= 1")


def score_answer(task: str, text: str, record: Mapping[str, Any]) -> tuple[str | None, float]:
    """(extracted answer, the task generator's score) of a decoded text; every engine uses this."""
    if task not in ANSWER_TASKS:
        raise ValueError(f"task {task!r} has no checkable answers; known: {sorted(ANSWER_TASKS)}")
    return ANSWER_TASKS[task].score_text(text, record["entry"])


@dataclasses.dataclass(frozen=True, slots=True)
class Likelihood:
    nll_per_token: float
    n_tokens: int
    n_sequences: int
    is_exact: bool

    @property
    def ppl(self) -> float:
        return math.exp(self.nll_per_token)


def check_finite_weights(model: LoadedModel) -> None:
    """Raise ValueError naming the model and a tensor when any weight is NaN or infinite (a
    diverged or corrupted checkpoint): its metrics would be NaN, so none are computed."""
    bad = [name for name, p in model.net.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        more = f" and {len(bad) - 1} more tensors" if len(bad) > 1 else ""
        raise ValueError(f"{model.path}: non-finite weights (NaN/inf) in {bad[0]}{more}")


@torch.no_grad()
def likelihood(
    model: LoadedModel, split: ArraySplit, *, batch_size: int, seed: int, limit: int | None = None
) -> Likelihood:
    net, paradigm = model.net, model.paradigm
    net.eval()
    device = next(net.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    nll, tokens, sequences = 0.0, 0, 0
    for batch in split.iterate(batch_size, limit):
        out = paradigm.loss(net, batch.to(device), generator)
        nll += float(out.nll_sum.sum())
        tokens += int(out.n_tokens.sum())
        sequences += batch.tokens.shape[0]
    if tokens == 0:
        raise ValueError("likelihood: the split has no target tokens")
    if not math.isfinite(nll):
        raise ValueError(f"{model.path}: non-finite loss ({nll}) on the test split")
    return Likelihood(nll / tokens, tokens, sequences, paradigm.exact_likelihood)


SCORING_BATCH = 64
"""Prompts decoded together where only the scores are used (training curves, `retrain.score`):
`generate_batch` yields each row's tokens and NFE exactly as decoding it alone."""


def answer_rows(
    model: LoadedModel,
    records: Iterable[Mapping[str, Any]],
    *,
    task: str,
    seq_len: int,
    decode_options: Mapping[str, Any],
    show_progress: bool = True,
    batch_size: int = 1,
) -> list[dict[str, Any]]:
    """Decode and score each record's prompt; raises for tasks without answers.

    `batch_size` > 1 decodes that many prompts together (`generate_batch`: the same tokens,
    NFE and stop per row as one at a time); a row's ``seconds`` and ``forward_seconds`` are then
    its batch's, shared with the other rows, so per-row latency needs ``batch_size`` 1."""
    if task not in ANSWER_TASKS:
        raise ValueError(f"task {task!r} has no checkable answers; known: {sorted(ANSWER_TASKS)}")
    if model.tokenizer is None:
        raise ValueError(f"{model.path}: model directory has no tokenizer.json")
    check(batch_size >= 1, "answer_rows: batch_size must be >= 1")
    tok = model.tokenizer
    records = list(records)
    prompts = [[tok.bos_id] + tok.encode(record["prompt"]) for record in records]
    for i, prompt in enumerate(prompts):
        if len(prompt) >= seq_len:
            raise ValueError(
                f"example {i}: prompt of {len(prompt)} tokens leaves no room in {seq_len}"
            )
    rows: list[dict[str, Any]] = []
    with progress_bar(total=len(records), desc=f"decode {task}", disable=not show_progress) as bar:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            budgets = [seq_len - len(prompt) for prompt in chunk]
            tic = time.perf_counter()
            if batch_size == 1:
                results = [
                    generate(
                        model,
                        chunk[0],
                        max_new_tokens=budgets[0],
                        stop_ids=[tok.eos_id],
                        **decode_options,
                    )
                ]
            else:
                results = generate_batch(
                    model, chunk, max_new_tokens=budgets, stop_ids=[tok.eos_id], **decode_options
                )
            seconds = time.perf_counter() - tic
            for i, (prompt, result) in enumerate(zip(chunk, results, strict=True), start):
                text = tok.decode(result.tokens)
                answer, score = score_answer(task, text, records[i])
                rows.append(
                    {
                        "index": i,
                        "prompt_tokens": len(prompt),
                        "new_tokens": len(result.tokens),
                        "nfe": result.nfe,
                        "seconds": seconds,
                        "forward_seconds": result.forward_seconds,
                        "stopped": result.stopped,
                        "text": text,
                        "answer": answer,
                        "reference": str(records[i]["answer"]),
                        "score": score,
                        "exact": float(score == 1.0),
                    }
                )
            bar.update(len(chunk))
    return rows
