"""A static-shape decode step, compiled (``generate(..., compile_step=True)``): every forward after
the first padded to ``policy.max_step(n_new)`` inputs over every slot of a static `KVCache`, run
through ``torch.compile`` (a CUDA graph on CUDA). See docs/design.md, "The decode engine".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from setdiff.kv_cache import KVCache

if TYPE_CHECKING:
    from setdiff.model import Transformer

STATIC_BUCKET = 64
"""The cache's slot count is rounded up to a multiple of this: one compiled graph serves every
decode whose prompt + new tokens fall in the same bucket."""

_COMPILED: dict[Any, Any] = {}
"""Model -> its compiled forward, kept for the life of the process (it holds the model)."""


def compiled_forward(net: Transformer) -> Any:
    """The model's forward through ``torch.compile`` (static shapes), built once per model."""
    if net not in _COMPILED:
        cuda = next(net.parameters()).is_cuda
        mode = "reduce-overhead" if cuda else None  # CUDA graphs on CUDA
        _COMPILED[net] = torch.compile(net, dynamic=False, mode=mode)
    return _COMPILED[net]


class StaticStep:
    """Runs a decode's forwards over a static `KVCache` of one row, each step padded to
    `n_inputs` inputs and compiled."""

    def __init__(self, net: Transformer, cache: KVCache, n_inputs: int, pad_id: int):
        self.net, self.cache, self.n_inputs, self.pad_id = net, cache, n_inputs, pad_id
        self.device = cache.k_NBGCE.device
        self.compiled = compiled_forward(net)
        if self.device.type == "cuda":  # the CUDA graph writes these in place
            torch._dynamo.mark_static_address(cache.k_NBGCE)
            torch._dynamo.mark_static_address(cache.v_NBGCE)

    def __call__(
        self, tokens_BT: torch.Tensor, positions_BT: torch.Tensor, mask_BTK: torch.Tensor | None
    ) -> torch.Tensor:
        """Logits (1, T, V) of the real inputs, from one row's `batch_inputs` (tokens, positions
        (1, T), mask (1, T, cache length + T) or None for all True), room made for the T inputs
        (the padding goes to the cache's slack)."""
        n, n_cached = tokens_BT.shape[1], self.cache.length
        total = max(n, self.n_inputs)
        full = torch.zeros(total, self.cache.slot_count, dtype=torch.bool)
        full[:n, : n_cached + n] = True if mask_BTK is None else mask_BTK[0]
        pad = torch.arange(n, total)
        full[pad, n_cached + pad] = True  # a padding row sees only its own key
        tokens = torch.cat((tokens_BT[0], tokens_BT.new_full((total - n,), self.pad_id)))
        positions = torch.cat((positions_BT[0], positions_BT.new_zeros(total - n)))
        self.cache.prepare(total)
        forward = self.compiled if total == self.n_inputs else self.net
        logits = forward(
            tokens[None].to(self.device),
            positions[None].to(self.device),
            full[None, None].to(self.device),
            self.cache,
        )
        return logits[:, :n]
