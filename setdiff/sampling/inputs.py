"""The inputs of one decoding forward: tokens, positions and mask rows, from a plan.

Shared by `generate` (one row) and `generate_batch` (each row on its own), cached or recomputed:
- with a cache holding `n_cached` entries, a forward feeds the plan's committed tokens then its
  queries, and its keys are those entries, then the inputs;
- without one (``n_cached=None``) it feeds every committed token again, then the queries.

Shifted queries (``shift=True``, paradigms trained with ``shift: true``): the query of position p
is fed at position p - 1 with the canvas token there (the decoded token, or [MASK] while it is
undecoded) and does not see that position's committed key, for which it stands in. Decoded left
to right, such a query computes exactly what an AR model computes at p - 1. (A query of position
0, a block diffusion query over BOS, has nothing before it and stays in place.)
"""

from __future__ import annotations

import torch

from setdiff.masks import decode_mask
from setdiff.sampling.state import DecodeState, Plan


def forward_inputs(
    state: DecodeState, plan: Plan, n_cached: int | None, *, shift: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (T,), positions (T,), mask (T, K)) of the forward that `plan` describes.

    The rows are the fed committed tokens then the queries; the columns the keys (cached
    entries, fed committed tokens, queries)."""
    all_groups = torch.cat((state.groups, plan.groups))
    committed = torch.cat((state.committed, plan.commit))
    n_keys = len(committed) if n_cached is None else n_cached + plan.commit.numel()
    fed = committed if n_cached is None else plan.commit
    key_positions = committed[len(committed) - n_keys :]
    mask = decode_mask(all_groups[len(all_groups) - n_keys :], fed.numel(), plan.query_attend)
    m = plan.queries.numel()
    # Position 0 (BOS, never a target) has nothing before it: its query stays in place.
    queries = (plan.queries - 1).clamp(min=0) if shift else plan.queries
    positions = torch.cat((fed, queries))
    tokens = state.canvas[positions]
    if shift and m:  # the query of p does not see p - 1's committed key (no key sits at -1)
        mask[-m:, :n_keys] &= key_positions != (plan.queries - 1)[:, None]
    return tokens, positions, mask
