"""The decode engine: plan -> forward -> select -> one read -> apply -> stop?, for every row of a
batch at once (`generate` is a batch of one row). Each row decodes exactly the forwards it would
decode alone; the choices of all rows are read to the host in one transfer per forward (a greedy
choice as rows of the forward's greedy table, `read_table`; any other, `read_picks`). See
docs/design.md, "The decode engine".
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import torch

from setdiff.sampling.inputs import batch_inputs
from setdiff.sampling.logits import greedy_table, mask_bias
from setdiff.sampling.policies import DecodeContext, DecodePolicy
from setdiff.sampling.state import DecodeState, Plan

if TYPE_CHECKING:
    from setdiff.kv_cache import KVCache
    from setdiff.model import Transformer
    from setdiff.sampling.static import StaticStep
    from setdiff.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateResult:
    tokens: list[int]
    """New token ids, up to and including the stop token when one fired."""
    nfe: int
    """Model forward calls actually made (prefill included)."""
    steps: list[list[int]]
    """Canvas positions decoded by each forward, in order (each generated position once)."""
    stopped: bool
    """True when a stop token ended decoding early."""
    forward_seconds: float
    """Wall time spent inside model forward calls (batched: the forwards the row took part in,
    shared with the other rows of those forwards)."""
    cache_length: int = 0
    """Committed KV-cache entries at the end (0 without a cache)."""
    logits: list[torch.Tensor] | None = None
    """With ``trace_logits=True``: each forward's logits for its committed then queried rows."""
    drafts: tuple[int, int] = (0, 0)
    """With ``verify=True`` or a ``draft`` model: drafts checked and drafts accepted (the
    acceptance rate's terms)."""
    draft_nfe: int = 0
    """With a ``draft`` model: its forward calls (`nfe` counts the main model's only)."""
    draft_seconds: float = 0.0
    """With a ``draft`` model: wall time inside its forward calls."""


class Stopper:
    """Finds the first stop (token id or string) in the decoded prefix, checking new tokens only."""

    def __init__(
        self, ids: set[int], strings: tuple[str, ...], tokenizer: Tokenizer | None
    ) -> None:
        self.ids, self.strings, self.tokenizer = ids, strings, tokenizer
        self.checked = 0  # generated tokens already scanned for stop ids
        self.active = bool(ids or strings)

    def find(self, state: DecodeState) -> int | None:
        """Canvas position of the token that completes the first stop, or None."""
        canvas, start, end = state.canvas, state.gen_start, state.verified_end()
        for p in range(start + self.checked, end):
            if canvas[p] in self.ids:
                return p
        if self.strings and end - start > self.checked:
            assert self.tokenizer is not None  # refused before any compute otherwise
            prefix = canvas[start:end]
            if any(s in self.tokenizer.decode(prefix) for s in self.strings):
                for i in range(self.checked, len(prefix)):
                    head = self.tokenizer.decode(prefix[: i + 1])
                    if any(s in head for s in self.strings):
                        return start + i
        self.checked = end - start
        return None


@dataclasses.dataclass(slots=True)
class Lane:
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


def run(
    net: Transformer,
    policy: DecodePolicy,
    lanes: list[Lane],
    cache: KVCache | None,
    trace_logits: bool,
    step: StaticStep | None = None,
) -> None:
    """Decode every lane to its end; each lane's `result` is set when it leaves. `step`: the
    forwards of one lane through a `StaticStep` (over `cache`)."""
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
        ready: list[Plan] = plans  # type: ignore[assignment]  # the finished rows have left
        for lane, plan in zip(active, ready, strict=True):
            lane.state.record_commit(plan.commit, plan.groups)
        tic = time.perf_counter()
        states = [lane.state for lane in active]
        logits_BTV, spans = _forward(net, states, ready, cache, device, policy, step)
        seconds = time.perf_counter() - tic
        rows = policy.rows_at_once(states, ready, spans)
        if any(rows):  # a greedy choice: rows of the step's greedy table (captured, or made here)
            table = None if step is None else step.table
            if table is None:
                bias = mask_bias(active[0].ctx.mask_id, logits_BTV.shape[-1], logits_BTV.device)
                table = greedy_table(logits_BTV, bias)
            picks = read_table(table, rows)
        else:  # sampled: each row chooses from its own logits
            each = enumerate(zip(active, ready, spans, strict=True))
            chosen = [
                policy.select(lane.state, plan, logits_BTV[r, start:end], lane.ctx)
                for r, (lane, plan, (start, end)) in each
            ]
            picks = read_picks(chosen)
        stopped = []
        for r, (lane, plan) in enumerate(zip(active, ready, strict=True)):
            lane.nfe += 1
            lane.forward_seconds += seconds
            if trace_logits:
                lane.traced.append(logits_BTV[r, spans[r][0] : spans[r][1]].clone())  # not a view
            positions, n_rejected = policy.apply(lane.state, plan, picks[r], lane.ctx)
            if cache is not None:
                if n_rejected:  # rejected drafts: as if never committed
                    cache.crop(cache.lengths[r] - n_rejected, r)
                lane.cache_length = cache.lengths[r]
            if positions:
                lane.steps.append(positions)
            if lane.stopper.active and (stop := lane.stopper.find(lane.state)) is not None:
                lane.stop_at = stop
                stopped.append(r)
        if stopped:
            active = [active[r] for r in _leave(active, stopped, cache, trace_logits)]


def read_picks(picks: list[tuple[torch.Tensor, ...]]) -> list[list[list[int]]]:
    """Every row's picks (1-D tensors) as lists of ints, read to the host in one transfer."""
    flat = [t for row in picks for t in row]
    if not flat:
        return [[] for _ in picks]
    values = (flat[0] if len(flat) == 1 else torch.cat(flat)).tolist()  # the step's one read
    out, at = [], 0
    for row in picks:
        lists = []
        for t in row:
            n = t.numel()
            part = values[at : at + n]  # ints come back as floats when read beside floats
            lists.append(part if t.is_floating_point() else [int(v) for v in part])
            at += n
        out.append(lists)
    return out


def read_table(table: torch.Tensor, rows: list[list[int]]) -> list[list[list[int]]]:
    """Each row's greedy tokens and confidences at its `rows` of a step's greedy table (2, B,
    T), read to the host in one transfer, as `read_picks` gives them."""
    tokens, confidence = table.tolist()  # the step's one read
    return [
        [[int(tokens[b][t]) for t in r], [confidence[b][t] for t in r]] for b, r in enumerate(rows)
    ]


def _forward(
    net: Transformer,
    states: list[DecodeState],
    plans: list[Plan],
    cache: KVCache | None,
    device: torch.device,
    policy: DecodePolicy,
    step: StaticStep | None,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """One batched forward: its logits (B, T, V), on the model's device, and each row's span
    of them, the rows of its committed tokens then queries. Each state has already recorded its
    plan's commit."""
    offsets = None
    if cache is not None:
        for r, plan in enumerate(plans):
            cache.make_room(len(plan.commit) + len(plan.queries), r)
        offsets = list(cache.lengths)
    pad_to, keys = (0, None) if step is None else (step.n_inputs, step.slots)
    inputs = batch_inputs(states, plans, offsets, shift=policy.shift, pad_to=pad_to, keys=keys)
    if cache is not None:
        cache.prepare(inputs.tokens.shape[1])
    mask = None if inputs.mask is None else _to(inputs.mask, device)
    forward = net if step is None else step
    logits = forward(_to(inputs.tokens, device), _to(inputs.positions, device), mask, cache)
    if cache is not None:
        for r, plan in enumerate(plans):
            cache.commit(len(plan.commit), r)
        cache.end_forward()
    return logits, inputs.outputs


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor if tensor.device == device else tensor.to(device)


def _leave(
    active: list[Lane], gone: list[int], cache: KVCache | None, trace_logits: bool
) -> list[int]:
    """Finish the lanes at rows `gone`; the rows that stay, in their new order.

    Each hole is filled with a staying row from the end of the batch, so the cache copies only
    those rows (`KVCache.keep_rows`), not the whole batch; the order of the rows does not
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


def _finish(lane: Lane, trace_logits: bool) -> None:
    state, drafter = lane.state, lane.ctx.drafter
    end = state.gen_end if lane.stop_at is None else lane.stop_at + 1
    lane.result = GenerateResult(
        tokens=state.canvas[state.gen_start : end],
        nfe=lane.nfe,
        steps=lane.steps,
        stopped=lane.stop_at is not None,
        forward_seconds=lane.forward_seconds,
        cache_length=lane.cache_length,
        logits=[t.cpu() for t in lane.traced] if trace_logits else None,
        drafts=(state.drafts_checked, state.drafts_accepted),
        draft_nfe=getattr(drafter, "nfe", 0),
        draft_seconds=getattr(drafter, "seconds", 0.0),
    )
