"""Batched decoding: B prompts of different lengths decode together, each row on its own.

`generate_batch` runs the same policy as `setdiff.sampling.loop.generate` for every row: each row
has its own `DecodeState` (window, accepted set, commit order), its own generator, its own stop.
Per step, every row still decoding plans its forward; the plans are padded to the longest one and
run as one batched forward with a per-row mask (a padding input sees only itself; a row's keys
are its own cache entries and inputs), and every row selects from its own logits. Rows that
finish leave the batch (their cache rows are dropped). With a cache, rows commit different
numbers of entries per forward: `RaggedKVCache` stages each row's inputs at its own offset.

So each row decodes exactly the forwards it would decode alone, in the same order, with the same
generator draws: its tokens, steps and NFE equal `generate` on that prompt (the logits agree to
float rounding, as cached and recomputed logits do; the tests hold both to that).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

import torch

from setdiff.kv_cache import RaggedKVCache
from setdiff.sampling.inputs import forward_inputs
from setdiff.sampling.loop import (
    Decodable,
    GenerateResult,
    Stopper,
    _as_ids,
    _as_int,
    _as_sequence,
    _as_stops,
    _unpack,
    check_cache_size,
    check_lengths,
)
from setdiff.sampling.policies import DecodeContext, DecodeOptions, DecodePolicy
from setdiff.sampling.state import DecodeState, Plan

if TYPE_CHECKING:
    from setdiff.model import Transformer
    from setdiff.paradigm import Paradigm


@dataclasses.dataclass(slots=True)
class _Lane:
    """One row of the batch and what it has decoded so far."""

    state: DecodeState
    ctx: DecodeContext
    stopper: Stopper
    nfe: int = 0
    forward_seconds: float = 0.0
    steps: list[list[int]] = dataclasses.field(default_factory=list)
    traced: list[torch.Tensor] = dataclasses.field(default_factory=list)
    stop_at: int | None = None
    cache_length: int = 0
    result: GenerateResult | None = None


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
    B, vocab_size = len(prompts), net.config.vocab_size
    rows_new = _per_row(max_new_tokens, B, "max_new_tokens")
    seeds = _per_row(seed, B, "seed")
    suffix_rows = [None] * B if suffixes is None else _as_sequence(suffixes, "suffixes", "suffixes")
    if len(suffix_rows) != B:
        raise ValueError(f"suffixes must hold one entry per prompt ({B}), got {len(suffix_rows)}")
    stops, strings = _as_stops(stop_ids, stop_strings)
    policy = paradigm.decode_policy(dict(policy_options))
    if strings and tokenizer is None:
        raise ValueError("stop_strings needs a LoadedModel with a tokenizer")
    lanes, capacities, needs = [], [], []
    for i in range(B):
        prompt = _as_ids(prompts[i], f"prompts[{i}]", vocab_size)
        suffix = suffix_rows[i]
        suffix = [] if suffix is None else _as_ids(suffix, f"suffixes[{i}]", vocab_size)
        names = (f"prompts[{i}]", f"max_new_tokens[{i}]", f"suffixes[{i}]")
        total = check_lengths(net, paradigm, prompt, suffix, rows_new[i], names=names)
        needs.append(check_cache_size(policy, prompt, suffix, rows_new[i], cache_size))
        capacities.append(cache_size or 2 * total)
        generator = torch.Generator().manual_seed(seeds[i])
        lanes.append(
            _Lane(
                state=DecodeState.new(prompt, rows_new[i], suffix, paradigm.mask_id),
                ctx=DecodeContext(mask_id=paradigm.mask_id, generator=generator, n_new=rows_new[i]),
                stopper=Stopper(set(stops), strings, tokenizer),
            )
        )
    cache = None
    if use_cache and policy.uses_cache:
        cache = RaggedKVCache.for_model(net, capacities, slack=max(needs))
    with torch.inference_mode():
        _run_batch(net, policy, lanes, cache, trace_logits)
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


def _run_batch(
    net: Transformer,
    policy: DecodePolicy,
    lanes: list[_Lane],
    cache: RaggedKVCache | None,
    trace_logits: bool,
) -> None:
    """The loop of `generate` for every lane at once; each lane's `result` is set at its end."""
    device = next(net.parameters()).device
    active = list(lanes)  # row r of the cache belongs to active[r]
    while active:
        plans = [policy.plan(lane.state) for lane in active]
        keep = [r for r, plan in enumerate(plans) if plan is not None]
        for r, plan in enumerate(plans):
            if plan is None:
                _finish(active[r], trace_logits)
        if len(keep) < len(active):
            if cache is not None and keep:
                cache.keep_rows(keep)
            active, plans = [active[r] for r in keep], [plans[r] for r in keep]
            if not active:
                break
        tic = time.perf_counter()
        logits = _forward_batch(net, active, plans, cache, device, policy.shift)
        seconds = time.perf_counter() - tic
        stopped = []
        for r, (lane, plan) in enumerate(zip(active, plans, strict=True)):
            lane.nfe += 1
            lane.forward_seconds += seconds
            lane.state.record_commit(plan.commit, plan.groups)
            if trace_logits:
                lane.traced.append(logits[r])
            positions, tokens = policy.select(lane.state, plan, logits[r], lane.ctx)
            if positions.numel():
                lane.state.accept(positions, tokens)
                lane.steps.append(positions.tolist())
            if cache is not None:
                lane.cache_length = cache.lengths[r]
            if lane.stopper.active and (stop := lane.stopper.find(lane.state)) is not None:
                lane.stop_at = stop
                stopped.append(r)
        if stopped:
            for r in stopped:
                _finish(active[r], trace_logits)
            keep = [r for r in range(len(active)) if r not in stopped]
            if cache is not None and keep:
                cache.keep_rows(keep)
            active = [active[r] for r in keep]


def _finish(lane: _Lane, trace_logits: bool) -> None:
    state = lane.state
    end = state.gen_end if lane.stop_at is None else lane.stop_at + 1
    lane.result = GenerateResult(
        tokens=state.canvas[state.gen_start : end].tolist(),
        nfe=lane.nfe,
        steps=lane.steps,
        stopped=lane.stop_at is not None,
        forward_seconds=lane.forward_seconds,
        cache_length=lane.cache_length,
        logits=lane.traced if trace_logits else None,
    )


def _row_inputs(
    state: DecodeState, plan: Plan, cache: RaggedKVCache | None, row: int, shift: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row's input tokens and positions (T_b,) and its decode mask (T_b, K_b) over its own
    keys."""
    n_cached = None
    if cache is not None:
        cache.make_room(row, plan.commit.numel() + plan.queries.numel())
        n_cached = cache.lengths[row]
    return forward_inputs(state, plan, n_cached, shift=shift)


def _forward_batch(
    net: Transformer,
    lanes: list[_Lane],
    plans: list[Plan],
    cache: RaggedKVCache | None,
    device: torch.device,
    shift: bool = False,
) -> list[torch.Tensor]:
    """One batched forward; per row, the logits (C_b + M_b, V) of its committed tokens then
    queries, as `setdiff.sampling.loop._forward` returns them for that row alone."""
    pairs = enumerate(zip(lanes, plans, strict=True))
    rows = [_row_inputs(lane.state, plan, cache, r, shift) for r, (lane, plan) in pairs]
    T = max(len(positions) for _, positions, _ in rows)
    offsets = cache.lengths if cache is not None else [0] * len(rows)
    n_keys = max(offsets) + T
    tokens_BT = torch.zeros(len(rows), T, dtype=torch.long)
    positions_BT = torch.zeros(len(rows), T, dtype=torch.long)
    mask_BTK = torch.zeros(len(rows), T, n_keys, dtype=torch.bool)
    for r, (tokens, positions, mask) in enumerate(rows):
        n, k = len(positions), mask.shape[1]  # k = offsets[r] + n
        tokens_BT[r, :n] = tokens
        positions_BT[r, :n] = positions
        mask_BTK[r, :n, :k] = mask
        # A padding input sees only itself: its row stays finite and nobody reads it.
        pad = torch.arange(n, T)
        mask_BTK[r, pad, offsets[r] + pad] = True
    attn = None if bool(mask_BTK.all()) else mask_BTK.to(device)
    if cache is not None:
        cache.prepare(T)
    logits = net(tokens_BT.to(device), positions_BT.to(device), attn, cache).cpu()
    if cache is not None:
        for r, plan in enumerate(plans):
            cache.commit(r, plan.commit)
        cache.end_forward()
    out = []
    for r, ((_, positions, _), plan) in enumerate(zip(rows, plans, strict=True)):
        n_out = plan.commit.numel() + plan.queries.numel()
        out.append(logits[r, len(positions) - n_out : len(positions)])
    return out
