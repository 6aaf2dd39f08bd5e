"""Batched decoding: B prompts of different lengths decode together, each row on its own.

`generate_batch` validates every row, builds one `setdiff.sampling.engine.Lane` per prompt (its
own `DecodeState`, generator and stop) and runs them through the engine that `generate` runs
with one row: each row decodes exactly the forwards it would decode alone, in the same order,
with the same generator draws, so its tokens, steps and NFE equal `generate` on that prompt (the
logits agree to float rounding, as cached and recomputed logits do; the tests hold both to that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

import torch

from setdiff.kv_cache import KVCache
from setdiff.sampling.engine import GenerateResult, run
from setdiff.sampling.loop import Decodable, _as_int, _as_sequence, _as_stops, _unpack, make_lane
from setdiff.sampling.policies import ARPolicy, DecodeOptions, decode_policy

if TYPE_CHECKING:
    from setdiff.model import Transformer
    from setdiff.paradigm import Paradigm


def generate_batch(
    model: Decodable | Transformer,
    prompts: Sequence[list[int] | torch.Tensor],
    *,
    max_new_tokens: int | Sequence[int],
    paradigm: Paradigm | None = None,
    suffixes: Sequence[list[int] | torch.Tensor | None] | None = None,
    use_cache: bool = True,
    seed: int | Sequence[int] = 0,
    stop_ids: list[int] | tuple[int, ...] = (),
    stop_strings: list[str] | tuple[str, ...] = (),
    cache_size: int | None = None,
    trace_logits: bool = False,
    **policy_options: Unpack[DecodeOptions],
) -> list[GenerateResult]:
    """Decode every prompt of `prompts` in one batch; one `GenerateResult` per row, in order.

    Row i equals ``generate(model, prompts[i], max_new_tokens=..., suffix_ids=suffixes[i],
    seed=seed_i, ...)`` (same tokens, steps, NFE and stop); the arguments mean the same, per row
    where a sequence is given.

    Args:
        prompts: one list of context token ids per row (lengths may differ).
        max_new_tokens: slots to generate, one int for every row or one per row.
        suffixes: None, or one right context (or None) per row, for infilling.
        seed: one seed for every row (each row gets its own generator seeded with it) or one
            per row.
        Other arguments: as `setdiff.sampling.loop.generate`.
    Returns:
        One `GenerateResult` per row. ``forward_seconds`` is the wall time of the batched
        forwards the row took part in (shared with the other rows of those forwards).
    Raises:
        ValueError: on any bad argument, before any compute, naming the row (``prompts[2]``).
    """
    net, paradigm, tokenizer = _unpack(model, paradigm)
    prompts = _as_sequence(prompts, "prompts", "prompts (lists of token ids)")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if isinstance(prompts[0], int) and not isinstance(prompts[0], bool):
        raise ValueError("prompts must be a list of prompts (lists of token ids), not one prompt")
    B = len(prompts)
    rows_new = _per_row(max_new_tokens, B, "max_new_tokens")
    seeds = _per_row(seed, B, "seed")
    suffix_rows = [None] * B if suffixes is None else _as_sequence(suffixes, "suffixes", "suffixes")
    if len(suffix_rows) != B:
        raise ValueError(f"suffixes must hold one entry per prompt ({B}), got {len(suffix_rows)}")
    stops = _as_stops(stop_ids, stop_strings, net, paradigm, tokenizer)
    policy = decode_policy(paradigm, dict(policy_options))
    if isinstance(policy, ARPolicy) and policy.speculative:
        raise ValueError(
            "draft_tokens: speculative decoding with a draft model is batch size 1 only: use "
            "generate(model, prompt, draft=..., draft_tokens=k)"
        )
    rows = [
        make_lane(net, paradigm, policy, *args, stops, cache_size, row=i)
        for i, args in enumerate(zip(prompts, suffix_rows, rows_new, seeds, strict=True))
    ]
    lanes = [lane for lane, _, _ in rows]
    cache = None
    if use_cache and policy.uses_cache:
        capacities = [cache_size or 2 * total for _, total, _ in rows]
        cache = KVCache.for_model(net, capacities, slack=max(need for _, _, need in rows))
    with torch.inference_mode():
        run(net, policy, lanes, cache, trace_logits)
    return [lane.result for lane in lanes]  # type: ignore[misc]


def _per_row(value: Any, n: int, name: str) -> list[int]:
    """One int for every row, or a sequence of one int per row."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if len(value) != n:
            raise ValueError(
                f"{name} must be an int or hold one per prompt ({n}), got {len(value)}"
            )
        return [_as_int(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return [_as_int(value, name)] * n
