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
from setdiff.sampling.policies import ARPolicy, DecodeContext, DecodeOptions, DecodePolicy
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
    stops, strings = _as_stops(stop_ids, stop_strings, vocab_size, paradigm.mask_id, tokenizer)
    policy = paradigm.decode_policy(dict(policy_options))
    if isinstance(policy, ARPolicy) and policy.speculative:
        raise ValueError(
            "draft_tokens: speculative decoding with a draft model is batch size 1 only: use "
            "generate(model, prompt, draft=..., draft_tokens=k)"
        )
    lanes, capacities, needs = [], [], []
    for i in range(B):
        prompt = _as_ids(prompts[i], f"prompts[{i}]", vocab_size, paradigm.mask_id)
        suffix = suffix_rows[i]
        suffix = (
            []
            if suffix is None
            else _as_ids(suffix, f"suffixes[{i}]", vocab_size, paradigm.mask_id)
        )
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
        done = [r for r, plan in enumerate(plans) if plan is None]
        if done:
            keep = _leave(active, done, cache, trace_logits)
            active, plans = [active[r] for r in keep], [plans[r] for r in keep]
            if not active:
                break
        for lane, plan in zip(active, plans, strict=True):
            lane.state.record_commit(plan.commit, plan.groups)
        tic = time.perf_counter()
        logits = _forward_batch(net, active, plans, cache, device, policy.shift)
        seconds = time.perf_counter() - tic
        stopped = []
        for r, (lane, plan) in enumerate(zip(active, plans, strict=True)):
            lane.nfe += 1
            lane.forward_seconds += seconds
            if trace_logits:
                lane.traced.append(logits[r])
            positions, n_rejected = policy.advance(lane.state, plan, logits[r], lane.ctx)
            if n_rejected and cache is not None:  # verify's rejected drafts
                cache.crop(r, cache.lengths[r] - n_rejected)
            if positions.numel():
                lane.steps.append(positions.tolist())
            if cache is not None:
                lane.cache_length = cache.lengths[r]
            if lane.stopper.active and (stop := lane.stopper.find(lane.state)) is not None:
                lane.stop_at = stop
                stopped.append(r)
        if stopped:
            active = [active[r] for r in _leave(active, stopped, cache, trace_logits)]


def _leave(
    active: list[_Lane], gone: list[int], cache: RaggedKVCache | None, trace_logits: bool
) -> list[int]:
    """Finish the lanes at rows `gone`; the rows that stay, in their new order.

    Each hole is filled with a staying row from the end of the batch, so the cache copies only
    those rows (`RaggedKVCache.keep_rows`), not the whole batch; the order of the rows does not
    change what any row decodes."""
    for r in gone:
        _finish(active[r], trace_logits)
    keep = fill_holes(len(active), gone)
    if cache is not None and keep:
        cache.keep_rows(keep)
    return keep


def fill_holes(n: int, gone: list[int]) -> list[int]:
    """The rows of `range(n)` not in `gone`: those below ``n - len(gone)`` in place, the rest
    moved into the holes (``fill_holes(5, [1]) == [0, 4, 2, 3]``)."""
    gone_set = set(gone)
    n_keep = n - len(gone_set)
    movers = iter(r for r in range(n_keep, n) if r not in gone_set)
    return [next(movers) if r in gone_set else r for r in range(n_keep)]


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
        drafts=(state.drafts_checked, state.drafts_accepted),
    )


# Group sentinels of the batched mask: a slot holding no committed entry has group _EMPTY, which
# no input sees through the group rule; a query input has group _QUERY (it sees every committed
# entry and no empty slot); a padding input has group -1 (it sees nothing through the rule).
_EMPTY = 1 << 62
_QUERY = _EMPTY - 1


def _forward_batch(
    net: Transformer,
    lanes: list[_Lane],
    plans: list[Plan],
    cache: RaggedKVCache | None,
    device: torch.device,
    shift: bool = False,
) -> list[torch.Tensor]:
    """One batched forward; per row, the logits (C_b + M_b, V) of its committed tokens then
    queries, as `setdiff.sampling.loop._forward` returns them for that row alone. Each lane's
    state has already recorded its plan's commit."""
    tokens_BT, positions_BT, mask_BTK, n_inputs = _batch_inputs(lanes, plans, cache, shift)
    attn = None if bool(mask_BTK.all()) else mask_BTK.to(device)
    if cache is not None:
        cache.prepare(tokens_BT.shape[1])
    logits = net(tokens_BT.to(device), positions_BT.to(device), attn, cache).cpu()
    if cache is not None:
        for r, plan in enumerate(plans):
            cache.commit(r, plan.commit)
        cache.end_forward()
    out = []
    for r, (n, plan) in enumerate(zip(n_inputs, plans, strict=True)):
        out.append(logits[r, n - plan.commit.numel() - plan.queries.numel() : n])
    return out


def _batch_inputs(
    lanes: list[_Lane], plans: list[Plan], cache: RaggedKVCache | None, shift: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """tokens (B, T), positions (B, T), mask (B, T, K) and each row's input count of one batched
    forward: row b's inputs and mask rows are `setdiff.sampling.inputs.forward_inputs`' for that
    row alone (its keys at its own cache offset), padded to the longest row; a padding input sees
    only itself, so its row stays finite and nobody reads it.

    Built for the whole batch at once (the per-row work is a few views and one gather) from the
    layout every row shares: a row's first ``o_b + F_b`` key slots hold its committed entries (o_b
    cached, then the F_b fed as inputs), then its M_b queries, then padding."""
    fed, queries, key_groups, key_positions, offsets = [], [], [], [], []
    for r, (lane, plan) in enumerate(zip(lanes, plans, strict=True)):
        state, n = lane.state, lane.state.n_committed  # n includes this plan's commit
        if cache is not None:
            cache.make_room(r, plan.commit.numel() + plan.queries.numel())
            offset, n_fed = cache.lengths[r], plan.commit.numel()
        else:
            offset, n_fed = 0, n
        n_keys = offset + n_fed
        offsets.append(offset)
        key_groups.append(state.group_of[n - n_keys : n])
        key_positions.append(state.order[n - n_keys : n])
        q = plan.queries
        # Shifted queries: the query of p is fed at p - 1 with the canvas token there.
        positions = torch.cat((state.order[n - n_fed : n], (q - 1).clamp(min=0) if shift else q))
        fed.append((state.canvas[positions], positions))
        queries.append(q)
    n_fed_B = torch.tensor([len(p) - len(q) for (_, p), q in zip(fed, queries, strict=True)])
    n_query_B = torch.tensor([len(q) for q in queries])
    n_inputs = [len(p) for _, p in fed]
    offset_B = torch.tensor(offsets)
    B, T = len(lanes), max(n_inputs)
    K = max(offsets) + T
    pad = torch.nn.utils.rnn.pad_sequence
    tokens_BT = pad([t for t, _ in fed], batch_first=True)
    positions_BT = pad([p for _, p in fed], batch_first=True)
    group_BK = torch.full((B, K), _EMPTY, dtype=torch.long)
    keys = pad(key_groups, batch_first=True, padding_value=_EMPTY)
    group_BK[:, : keys.shape[1]] = keys
    # An input's group: a fed committed token's is its key slot's (o_b + t); a query sees every
    # committed entry; a padding input none.
    t_BT = torch.arange(T).expand(B, T)
    own_slot_BT = offset_B[:, None] + t_BT
    is_fed = t_BT < n_fed_B[:, None]
    is_query = ~is_fed & (t_BT < (n_fed_B + n_query_B)[:, None])
    input_group_BT = torch.where(is_fed, group_BK.gather(1, own_slot_BT), -1)
    input_group_BT = torch.where(is_query, _QUERY, input_group_BT)
    mask_BTK = group_BK[:, None, :] <= input_group_BT[:, :, None]
    for r, (plan, n_fed) in enumerate(zip(plans, n_fed_B.tolist(), strict=True)):
        m, first = plan.queries.numel(), offsets[r] + n_fed  # first: the row's first query key
        if m:
            mask_BTK[r, n_fed : n_fed + m, first : first + m] = plan.query_attend
    if shift:
        # A shifted query of p > 0 does not see p - 1's committed key, for which it stands in.
        M = int(n_query_B.max())
        q_BM = pad(queries, batch_first=True) if M else torch.zeros(B, 0, dtype=torch.long)
        hidden_BM = torch.where(q_BM > 0, q_BM - 1, -2)
        hidden_BT = torch.full((B, T + M), -2, dtype=torch.long)
        hidden_BT.scatter_(1, n_fed_B[:, None] + torch.arange(M), hidden_BM)
        position_BK = torch.full((B, K), -1, dtype=torch.long)
        keys = pad(key_positions, batch_first=True, padding_value=-1)
        position_BK[:, : keys.shape[1]] = keys
        mask_BTK &= position_BK[:, None, :] != hidden_BT[:, :T, None]
    rows, cols = (~(is_fed | is_query)).nonzero(as_tuple=True)
    mask_BTK[rows, cols, offset_B[rows] + cols] = True
    return tokens_BT, positions_BT, mask_BTK, n_inputs
