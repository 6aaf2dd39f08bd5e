"""Text quality of one model: verse infilling and unconditional samples, scored by an AR judge.

Protocols (spec sections 5.2 and 7, scaled down to KJV verses):
- infilling: three consecutive verses of one chapter; the middle one is masked with its true
  length (oracle). Paradigms that can infill (`can_infill`) decode it between both sides;
  ``ar`` and ``bd3lm`` see only the left context and generate exactly that many tokens (the
  paper's AR infilling baseline). Scored by ROUGE-L F and exact match with the reference verse.
- unconditional: from ``<bos>`` with the paradigm's sampler, up to a token budget, stopping at
  EOS. Scored by generative perplexity under an ``ar`` judge (exact next-token likelihood),
  unigram entropy and distinct-n.

Pure: verse records and token lists in, records out; no files and no params. Latency and peak
memory follow `setdiff.measure` (whole request, by the device's clock).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from setdiff.artifacts import LoadedModel
from setdiff.config import Device, Seed, check, frozen
from setdiff.masks import causal_mask
from setdiff.measure import peak_memory_mb, reset_peak_memory, timed
from setdiff.sampling.loop import GenerateResult, generate
from setdiff.sampling.policies import decode_policy
from setdiff.tokenizer import Tokenizer

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# sample statistics


@frozen
class TextGenConfig:
    """What the textgen stage decodes and how (the decode policy itself is decode.<paradigm>)."""

    n_infill: int = 64
    """Verse triples whose middle verse is infilled and scored (after the warm-up ones)."""
    infill_context: int = 0
    """Context tokens kept on each side of the masked verse (last of v1, first of v3);
    0 = whole verses. Needed when three verses rarely fit the model's context."""
    n_uncond: int = 16
    """Unconditional samples scored (after the warm-up ones)."""
    uncond_tokens: int = 127
    """Token budget of an unconditional sample; at most the model's max_seq_len - 1."""
    seed: Seed = 0
    """Seed of the triple draw and of the samplers (decode i uses seed + i)."""
    temperature: float = 1.0
    """Sampling temperature of the unconditional samples (infilling keeps decode.<paradigm>)."""
    top_p: float = 0.95
    """Nucleus mass of the unconditional samples (spec section 7: 0.95)."""
    warmup: int = 2
    """Decodes of each kind run first and not recorded (timing warm-up)."""
    device: Device = "cpu"
    """torch device of the model and the judge, e.g. ``cpu`` or ``cuda``."""
    threads: int = 0
    """torch intra-op threads; 0 = torch's default."""

    def __post_init__(self) -> None:
        check(self.n_infill >= 1, f"n_infill must be >= 1, got {self.n_infill}")
        check(self.infill_context >= 0, f"infill_context must be >= 0, got {self.infill_context}")
        check(self.n_uncond >= 1, f"n_uncond must be >= 1, got {self.n_uncond}")
        check(self.uncond_tokens >= 1, f"uncond_tokens must be >= 1, got {self.uncond_tokens}")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.warmup >= 0, f"warmup must be >= 0, got {self.warmup}")
        check(self.threads >= 0, f"threads must be >= 0, got {self.threads}")


def unigram_entropy(tokens: Sequence[int]) -> float:
    """Entropy (nats) of the empirical token distribution of one sample; NaN when empty."""
    if len(tokens) == 0:
        return math.nan
    _, counts = np.unique(np.asarray(tokens), return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def _ngrams(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(samples: Sequence[Sequence[int]], n: int) -> float:
    """Unique n-grams over all samples / all n-grams (no n-gram spans two samples); NaN if none."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [g for sample in samples for g in _ngrams(sample, n)]
    return len(set(grams)) / len(grams) if grams else math.nan


def repetition_rate(samples: Sequence[Sequence[int]], n: int = 4) -> float:
    """Share of n-grams repeating an earlier n-gram of the same sample (degenerate loops)."""
    total = repeated = 0
    for sample in samples:
        grams = _ngrams(sample, n)
        total += len(grams)
        repeated += len(grams) - len(set(grams))
    return repeated / total if total else math.nan


# ---------------------------------------------------------------------------------------------
# the judge


@torch.no_grad()
def token_nll(
    judge: LoadedModel, samples: Sequence[Sequence[int]], bos_id: int
) -> list[np.ndarray]:
    """Per-token NLL (nats) of each sample after ``<bos>`` under an ``ar`` judge.

    Each sample is scored alone (no padding), truncated to the judge's max_seq_len.

    Returns:
        One float64 array per sample, (min(len(sample), max_seq_len - 1),).
    Raises:
        ValueError: if the judge is not an ``ar`` model.
    """
    if not judge.paradigm.exact_likelihood:
        raise ValueError(f"the judge must be an ar model, got {judge.paradigm.config.name!r}")
    net = judge.net
    device = next(net.parameters()).device
    limit = net.config.max_seq_len
    nlls = []
    for sample in samples:
        ids = torch.tensor([bos_id, *sample][:limit], dtype=torch.long, device=device)  # (L,)
        n = ids.numel() - 1
        if n == 0:
            nlls.append(np.zeros(0))
            continue
        positions = torch.arange(n, device=device)
        logits = net(ids[None, :-1], positions[None], causal_mask(n).to(device))[0]  # (n, V)
        nll = F.cross_entropy(logits.float(), ids[1:], reduction="none")
        nlls.append(nll.cpu().numpy().astype(np.float64))
    return nlls


def judge_nll(judge: LoadedModel, samples: Sequence[Sequence[int]], bos_id: int) -> list[float]:
    """Mean NLL per token of each sample under an ``ar`` judge (NaN for an empty sample).

    Generative perplexity is `generative_perplexity` of `token_nll` (token-weighted).
    """
    return [float(x.mean()) if x.size else math.nan for x in token_nll(judge, samples, bos_id)]


def generative_perplexity(token_nlls: Sequence[np.ndarray]) -> float:
    """exp(sum NLL / sum tokens) over all samples' tokens; NaN when there are none."""
    flat = np.concatenate([np.zeros(0), *token_nlls])
    return math.exp(float(flat.mean())) if flat.size else math.nan


@functools.cache
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure of `prediction` against `reference` (`rouge_score`, no stemming)."""
    return float(_rouge_scorer().score(reference, prediction)["rougeL"].fmeasure)


# ---------------------------------------------------------------------------------------------
# infilling


@dataclasses.dataclass(frozen=True, slots=True)
class InfillExample:
    """Three consecutive verses; the middle one is the span to fill (its length is given)."""

    left: list[int]
    """Tokens of ``v1 + "\\n"`` (possibly only its last ones); ``<bos>`` is not included."""
    middle: list[int]
    """Tokens of ``v2 + "\\n"``: the reference span; len(middle) slots are decoded."""
    right: list[int]
    """Tokens of ``v3`` (possibly only its first ones)."""
    reference: str
    """The text of v2."""
    source: str
    """Where the middle verse is, e.g. ``"Acts 2:4"``."""


def _is_triple(a: Mapping[str, Any], b: Mapping[str, Any], c: Mapping[str, Any]) -> bool:
    same = (a["book"], a["chapter"]) == (b["book"], b["chapter"]) == (c["book"], c["chapter"])
    return same and b["verse"] == a["verse"] + 1 and c["verse"] == b["verse"] + 1


def infill_examples(
    verses: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    n: int,
    seed: int,
    max_len: int,
    *,
    context_tokens: int = 0,
) -> list[InfillExample]:
    """`n` infilling examples from consecutive verses of one chapter, drawn with `seed`.

    Args:
        verses: records ``{"book", "chapter", "verse", "text"}`` in reading order.
        tokenizer: the models' tokenizer.
        n: examples to draw (without replacement, in drawn order).
        seed: the draw's seed; the same inputs and seed give the same examples.
        max_len: a triple fits when ``1 + len(left) + len(middle) + len(right) <= max_len``
            (``<bos>`` included); triples that do not fit are skipped.
        context_tokens: 0 = whole verses on both sides; k > 0 keeps the last k tokens of v1
            and the first k tokens of v3 (a fixed context budget, for short models).
    Raises:
        ValueError: if fewer than `n` triples fit.
    """
    if n < 0 or context_tokens < 0:
        raise ValueError(f"n and context_tokens must be >= 0, got {n}, {context_tokens}")
    texts = [v["text"] for v in verses]
    lines = tokenizer.encode_batch([t + "\n" for t in texts])
    bare = tokenizer.encode_batch(texts)
    candidates, n_triples = [], 0
    for i in range(len(verses) - 2):
        if not _is_triple(*verses[i : i + 3]):
            continue
        n_triples += 1
        left, right = lines[i], bare[i + 2]
        if context_tokens:
            left, right = left[-context_tokens:], right[:context_tokens]
        if 1 + len(left) + len(lines[i + 1]) + len(right) <= max_len:
            b = verses[i + 1]
            source = f"{b['book']} {b['chapter']}:{b['verse']}"
            candidates.append(InfillExample(left, lines[i + 1], right, texts[i + 1], source))
    if len(candidates) < n:
        raise ValueError(
            f"only {len(candidates)} of {n_triples} verse triples fit max_len={max_len} "
            f"(context_tokens={context_tokens}); {n} requested"
        )
    pick = np.random.default_rng(seed).choice(len(candidates), size=n, replace=False)
    return [candidates[int(i)] for i in pick]


def _measured(fn: Callable[[], T], device: torch.device) -> tuple[T, float, float]:
    """(result, wall seconds, peak memory MB) of one request, per `setdiff.measure`."""
    reset_peak_memory(device)
    result, seconds = timed(fn, device)
    return result, seconds, peak_memory_mb(device)


def _tokenizer(model: LoadedModel) -> Tokenizer:
    if model.tokenizer is None:
        raise ValueError(f"{model.path}: model directory has no tokenizer.json")
    return model.tokenizer


@dataclasses.dataclass(frozen=True, slots=True)
class InfillResult:
    example: InfillExample
    generation: GenerateResult
    """The decode; ``generation.tokens`` are the len(middle) infilled tokens."""
    text: str
    """The infilled text, stripped."""
    rouge_l: float
    exact: float
    """1.0 if the stripped text equals the reference verse, else 0.0."""
    uses_right_context: bool
    """True: decoded between both sides; False: left context only (AR protocol)."""
    prompt_tokens: int
    """Given tokens the decode conditioned on: ``<bos>`` + left (+ right)."""
    latency_s: float
    peak_mem_mb: float


def infill(
    model: LoadedModel,
    example: InfillExample,
    *,
    decode_options: Mapping[str, Any],
    seed: int = 0,
) -> InfillResult:
    """Fill the middle verse of `example` with the model's sampler (see the module docstring)."""
    tokenizer = _tokenizer(model)
    uses_right = model.paradigm.can_infill
    prompt = [tokenizer.bos_id, *example.left]
    suffix = example.right if uses_right else None
    device = next(model.net.parameters()).device
    generation, seconds, peak = _measured(
        lambda: generate(
            model,
            prompt,
            max_new_tokens=len(example.middle),
            suffix_ids=suffix,
            seed=seed,
            **decode_options,
        ),
        device,
    )
    text = tokenizer.decode(generation.tokens).strip()
    reference = example.reference.strip()
    return InfillResult(
        example=example,
        generation=generation,
        text=text,
        rouge_l=rouge_l(text, reference),
        exact=float(text == reference),
        uses_right_context=uses_right,
        prompt_tokens=len(prompt) + (len(example.right) if uses_right else 0),
        latency_s=seconds,
        peak_mem_mb=peak,
    )


# ---------------------------------------------------------------------------------------------
# unconditional generation


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    generation: GenerateResult
    tokens: list[int]
    """The sample's text tokens: the generated ones before the stop token (EOS excluded)."""
    latency_s: float
    peak_mem_mb: float

    @property
    def new_tokens(self) -> int:
        """Generated tokens by the measurement contract (the stop token included)."""
        return len(self.generation.tokens)


def with_sampling(
    model: LoadedModel, options: Mapping[str, Any], *, temperature: float, top_p: float
) -> dict[str, Any]:
    """`options` with `temperature` and `top_p` set where the paradigm's policy has them.

    Raises:
        ValueError: if the resulting options are invalid for the paradigm's policy.
    """
    policy = decode_policy(model.paradigm, dict(options))
    names = {f.name for f in dataclasses.fields(policy)}
    sampling = {"temperature": temperature, "top_p": top_p}
    merged = {**options, **{k: v for k, v in sampling.items() if k in names}}
    decode_policy(model.paradigm, dict(merged))
    return merged


def unconditional(
    model: LoadedModel,
    *,
    n_samples: int,
    max_new_tokens: int,
    seed: int,
    decode_options: Mapping[str, Any],
) -> list[Sample]:
    """`n_samples` samples from ``<bos>``, sample i seeded with ``seed + i``, stopping at EOS."""
    tokenizer = _tokenizer(model)
    device = next(model.net.parameters()).device
    samples = []
    for i in range(n_samples):
        generation, seconds, peak = _measured(
            lambda i=i: generate(
                model,
                [tokenizer.bos_id],
                max_new_tokens=max_new_tokens,
                stop_ids=[tokenizer.eos_id],
                seed=seed + i,
                **decode_options,
            ),
            device,
        )
        tokens = generation.tokens[:-1] if generation.stopped else generation.tokens
        samples.append(Sample(generation, list(tokens), seconds, peak))
    return samples
