"""Pure helpers that turn logits into a choice and a confidence. No state, no model."""

from __future__ import annotations

import functools
import struct

import torch


def choose_tokens(
    logits_MV: torch.Tensor,
    *,
    mask_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and report its probability (the confidence).

    The [MASK] logit is set to -inf; ``temperature == 0`` is greedy (confidence from the plain
    softmax), otherwise tokens are sampled from ``softmax(logits / temperature)`` restricted to
    the nucleus `top_p` (the crossing token kept, then renormalised).

    Returns:
        tokens (M,) long and confidence (M,) float = probability of the chosen token.
    """
    bias = mask_bias(mask_id, logits_MV.shape[-1], logits_MV.device)
    if temperature == 0.0:
        return greedy(logits_MV, bias)
    probs = torch.softmax((logits_MV.float() + bias) / temperature, dim=-1)
    if top_p < 1.0:
        probs = nucleus(probs, top_p)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1)


def greedy(logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy token of every row of `logits` (..., V) and its probability, `bias`
    (`mask_bias`) added first."""
    confidence, tokens = torch.softmax(logits.float() + bias, dim=-1).max(dim=-1)
    return tokens, confidence


def greedy_table(logits_BTV: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Every row's `greedy` token and its confidence as one (2, B, T) float table, read by the
    host in one transfer: the token ids as floats, exact below 2**24 (the samplers refuse a
    larger vocabulary)."""
    tokens, confidence = greedy(logits_BTV, bias)
    return torch.stack((tokens.float(), confidence))


@functools.cache
def mask_bias(mask_id: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """(V,) zeros with -inf at `mask_id`: added to logits, it sets the [MASK] logit to -inf and
    leaves the others exactly as they are (one op, cheaper than an index fill). Made once per
    device, as a normal tensor, not an inference one: autograd may save it."""
    with torch.inference_mode(False):
        return torch.zeros(vocab_size, device=device).index_fill(
            0, torch.tensor([mask_id]).to(device), float("-inf")
        )


def nucleus(probs_MV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of sorted tokens whose mass reaches `top_p`; renormalise."""
    sorted_probs, order = probs_MV.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    kept = torch.zeros_like(probs_MV).scatter(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def accept_confident(confidence: list[float], threshold: float | None) -> list[bool]:
    """Accept the most confident one (the first, on a tie), plus every one with confidence >=
    `threshold`, compared in float32 as a float32 tensor compares with it; on the host, from
    confidences read with the step's one read."""
    if threshold is None:
        keep = [False] * len(confidence)
    else:
        bound = _float32(threshold)
        keep = [c >= bound for c in confidence]
    keep[confidence.index(max(confidence))] = True
    return keep


@functools.cache
def _float32(value: float) -> float:
    """`value` rounded to float32 (as a float32 tensor holds it)."""
    return struct.unpack("f", struct.pack("f", value))[0]
