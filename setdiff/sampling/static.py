"""A static-shape decode step, compiled (``generate(..., compile_step=True)``): every forward after
the first padded to ``policy.max_step(n_new)`` inputs over every slot of a static `KVCache`, run
through ``torch.compile`` (a CUDA graph on CUDA). See docs/design.md, "The decode engine".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from setdiff.kv_cache import KVCache
from setdiff.sampling.logits import greedy_table, mask_bias

if TYPE_CHECKING:
    from setdiff.model import Transformer

STATIC_BUCKET = 64
"""The cache's slot count is rounded up to a multiple of this: one compiled graph serves every
decode whose prompt + new tokens fall in the same bucket."""

_COMPILED: dict[Any, Any] = {}
"""(model, [MASK] id) -> its compiled step, kept for the life of the process (it holds the
model)."""


def greedy_forward(net: Transformer, mask_id: int) -> Any:
    """The forward and every row's greedy choice as one function, to be captured together:
    ``(tokens, positions, mask, cache) -> (logits (B, T, V), greedy_table (2, B, T))``."""
    bias = mask_bias(mask_id, net.config.vocab_size, next(net.parameters()).device)

    def forward(tokens: Any, positions: Any, mask: Any, cache: KVCache) -> Any:
        logits = net(tokens, positions, mask, cache)
        return logits, greedy_table(logits, bias)

    return forward


def compiled_forward(net: Transformer, mask_id: int) -> Any:
    """`greedy_forward` through ``torch.compile`` (static shapes), built once per model."""
    if (net, mask_id) not in _COMPILED:
        cuda = next(net.parameters()).is_cuda
        mode = "reduce-overhead" if cuda else None  # CUDA graphs on CUDA
        step = torch.compile(greedy_forward(net, mask_id), dynamic=False, mode=mode)
        _COMPILED[net, mask_id] = step
    return _COMPILED[net, mask_id]


class StaticStep:
    """The forwards of a decode over a static `KVCache` of one row: those of `n_inputs` inputs
    (every step, padded to it by `setdiff.sampling.inputs.batch_inputs`) compiled with every
    row's greedy choice (`table`, for the policies that choose greedily), a larger one (a
    prefill longer than a step) eager."""

    def __init__(self, net: Transformer, cache: KVCache, n_inputs: int, mask_id: int):
        self.net, self.n_inputs, self.slots = net, n_inputs, cache.slot_count
        self.compiled = compiled_forward(net, mask_id)
        self.table: torch.Tensor | None = None
        """The last forward's greedy table (2, 1, T), None after an eager forward."""
        if cache.device.type == "cuda":  # the CUDA graph writes these in place
            torch._dynamo.mark_static_address(cache.k_NBGCE)
            torch._dynamo.mark_static_address(cache.v_NBGCE)

    def __call__(
        self, tokens_BT: torch.Tensor, positions_BT: torch.Tensor, mask: Any, cache: KVCache
    ) -> torch.Tensor:
        if tokens_BT.shape[1] != self.n_inputs:
            self.table = None
            return self.net(tokens_BT, positions_BT, mask, cache)
        logits, self.table = self.compiled(tokens_BT, positions_BT, mask, cache)
        return logits
