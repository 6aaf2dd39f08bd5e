"""The inputs of one decoding forward over a batch of rows: tokens, positions and mask, from each
row's plan, built from the host's plain state in a few tensor ops whatever the batch size (the
one input builder; the mask rows follow `setdiff.masks.decode_mask`, shifted queries included).
See docs/design.md, "The decode engine".
"""

from __future__ import annotations

import dataclasses

import torch

from setdiff.sampling.state import DecodeState, Plan, long_tensor


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    tokens: torch.Tensor
    """(B, T) long."""
    positions: torch.Tensor
    """(B, T) long."""
    mask: torch.Tensor | None
    """(B, T, K) bool, K = max offset + T; None when every entry would be True."""
    outputs: list[tuple[int, int]]
    """Per row, the input rows of its committed tokens then queries (the logits it reads)."""


def batch_inputs(
    states: list[DecodeState],
    plans: list[Plan],
    offsets: list[int] | None,
    *,
    shift: bool,
    pad_to: int = 0,
    keys: int | None = None,
) -> Inputs:
    """The inputs of one forward of rows `states` (each has recorded its plan's commit) at cache
    `offsets` (None: no cache), padded to at least `pad_to` inputs, the mask over `keys` key
    slots (a static cache's; default: the longest row's offset + inputs)."""
    fed_B, n_fed_B, n_keys_B, full = [], [], [], True
    for r, (state, plan) in enumerate(zip(states, plans, strict=True)):
        n = state.n_committed
        n_fed = len(plan.commit) if offsets is not None else n
        n_keys = n_fed + (offsets[r] if offsets is not None else 0)
        q = plan.queries
        fed_B.append(state.order[n - n_fed : n] + ([max(p - 1, 0) for p in q] if shift else q))
        n_fed_B.append(n_fed)
        n_keys_B.append(n_keys)
        full = full and _row_full(state, plan, n_fed, n_keys, shift)
    n_inputs = [len(fed) for fed in fed_B]
    T, offset_B = max(*n_inputs, pad_to), offsets or [0] * len(states)
    flat = []
    for state, fed in zip(states, fed_B, strict=True):
        flat += [state.canvas[p] for p in fed] + [0] * (T - len(fed))
    for fed in fed_B:
        flat += fed + [0] * (T - len(fed))
    tokens, positions = long_tensor(flat).view(2, len(states), T).unbind()
    outputs = [
        (n - len(p.commit) - len(p.queries), n) for n, p in zip(n_inputs, plans, strict=True)
    ]
    full = full and len(set(offset_B)) == 1 and set(n_inputs) == {T} and keys is None
    K = keys or max(offset_B) + T
    mask = None if full else _mask(states, plans, n_fed_B, n_keys_B, offset_B, T, K, shift)
    return Inputs(tokens, positions, mask, outputs)


def _attends_all(plan: Plan) -> bool:
    return plan.query_attend == "all" or (plan.query_attend == "self" and len(plan.queries) <= 1)


def _hidden(state: DecodeState, plan: Plan, n_keys: int) -> list[tuple[int, int]]:
    """Shifted queries: (query index, key index) of each query of p > 0 and p - 1's committed
    key among the row's `n_keys` keys (the last committed entries), for which it stands in."""
    first = state.n_committed - n_keys
    out = []
    for j, q in enumerate(plan.queries):
        if q > 0 and state.slot[q - 1] >= first:
            out.append((j, state.slot[q - 1] - first))
    return out


def _row_full(state: DecodeState, plan: Plan, n_fed: int, n_keys: int, shift: bool) -> bool:
    """Whether a row's mask (alone, unpadded) is all True."""
    if not plan.queries:  # fed rows see every key iff they share the last group
        return not n_fed or state.group_of[-n_fed] == state.group_of[-1]
    if n_fed or not _attends_all(plan):  # a fed row never sees a query
        return False
    return not (shift and _hidden(state, plan, n_keys))


def _mask(
    states: list[DecodeState],
    plans: list[Plan],
    n_fed_B: list[int],
    n_keys_B: list[int],
    offset_B: list[int],
    T: int,
    K: int,
    shift: bool,
) -> torch.Tensor:
    """The (B, T, K) mask of `batch_inputs`.

    Groups never decrease in commit order (`DecodeState.record_commit` holds to it), so the keys
    an input sees by the group rule are a prefix of its row's slots: a fed token sees up to the
    last key of its group; a query every committed key, and the other queries too when they all
    see each other; a padding input none. Single entries are then set: padding inputs and
    "self" queries see their own slot, shifted queries do not see the key they stand in for."""
    B = len(plans)
    ones, zeros = b"\x01" * K, bytes(K)
    rows, given, points = [], [], []
    for r, (state, plan) in enumerate(zip(states, plans, strict=True)):
        n_f, n_k, m = n_fed_B[r], n_keys_B[r], len(plan.queries)
        fed_groups, first = state.group_of[len(state.group_of) - n_f :], n_k - n_f
        ends, end = [0] * n_f, n_k  # one past the last key of each fed token's group
        for t in range(n_f - 1, -1, -1):
            if t + 1 < n_f and fed_groups[t] != fed_groups[t + 1]:
                end = first + t + 1
            ends[t] = end
        see_all = _attends_all(plan)
        reach = ends + [n_k + m if see_all else n_k] * m + [0] * (T - n_f - m)
        rows += [ones[:n] + zeros[n:] for n in reach]
        if not see_all and plan.query_attend == "self":
            points += [((r * T + n_f + j) * K + n_k + j, 1) for j in range(m)]
        elif not see_all:
            given.append((r, n_f, n_k, plan.query_attend))
        points += [((r * T + t) * K + offset_B[r] + t, 1) for t in range(n_f + m, T)]  # padding
        if shift:
            points += [((r * T + n_f + j) * K + key, 0) for j, key in _hidden(state, plan, n_k)]
    flat = bytearray(b"".join(rows))
    for at, value in points:
        flat[at] = value
    mask_BTK = torch.frombuffer(flat, dtype=torch.bool).view(B, T, K)
    for r, n_f, n_k, attend in given:
        mask_BTK[r, n_f : n_f + attend.shape[0], n_k : n_k + attend.shape[0]] = attend
    return mask_BTK
