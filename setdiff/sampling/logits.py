"""Pure helpers that turn logits into a choice and a confidence. No state, no model."""

from __future__ import annotations

import torch

from setdiff.sampling.state import long_tensor


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
    logits = (logits_MV if logits_MV.dtype == torch.float32 else logits_MV.float()).clone()
    logits.narrow(-1, mask_id, 1).fill_(float("-inf"))
    if temperature == 0.0:
        probs = torch.softmax(logits, dim=-1)
        confidence, tokens = probs.max(dim=-1)
        return tokens, confidence
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        probs = nucleus(probs, top_p)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1)


def nucleus(probs_MV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of sorted tokens whose mass reaches `top_p`; renormalise."""
    sorted_probs, order = probs_MV.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    kept = torch.zeros_like(probs_MV).scatter(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def accept_confident(confidence_M: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """(M,) bool: accept the most confident one, plus every one with confidence >= threshold.

    A mask rather than indices, so that choosing reads nothing back to the host."""
    keep = (
        torch.zeros_like(confidence_M, dtype=torch.bool)
        if threshold is None
        else confidence_M >= threshold
    )
    return keep.scatter(0, confidence_M.argmax().reshape(1), True)


def greedy_rows(
    logits_BTV: torch.Tensor, rows: list[list[int]], mask_id: int, threshold: float | None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Greedy tokens and accept masks (`accept_confident`) of many rows at once, in a fixed
    number of ops: row b reads its logits rows ``logits_BTV[b, rows[b]]``; returns per row its
    (tokens, keep) views, as ``choose_tokens`` and ``accept_confident`` give them row by row."""
    B, T, V = logits_BTV.shape
    sizes = [len(r) for r in rows]
    M, N = max(sizes), sum(sizes)
    at = [b * T + t for b, r in enumerate(rows) for t in r]
    slots = [b * M + j for b, n in enumerate(sizes) for j in range(n)]
    index = long_tensor(at + slots).to(logits_BTV.device)
    at_N, slots_N = index[:N], index[N:]
    tokens, confidence = choose_tokens(logits_BTV.reshape(B * T, V)[at_N], mask_id=mask_id)
    conf_BM = confidence.new_full((B * M,), -1.0).index_copy(0, slots_N, confidence).view(B, M)
    keep_BM = (
        torch.zeros_like(conf_BM, dtype=torch.bool) if threshold is None else conf_BM >= threshold
    )
    keep_BM = keep_BM.scatter(1, conf_BM.argmax(1, keepdim=True), True)
    keep = keep_BM.view(-1)[slots_N]
    return list(zip(tokens.split(sizes), keep.split(sizes), strict=True))
