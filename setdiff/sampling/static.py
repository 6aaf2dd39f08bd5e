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
    """The forwards of a decode over a static `KVCache` of one row: those of `n_inputs` inputs
    (every step, padded to it by `setdiff.sampling.inputs.batch_inputs`) compiled, a larger one
    (a prefill longer than a step) eager."""

    def __init__(self, net: Transformer, cache: KVCache, n_inputs: int):
        self.net, self.n_inputs, self.slots = net, n_inputs, cache.slot_count
        self.compiled = compiled_forward(net)
        if cache.device.type == "cuda":  # the CUDA graph writes these in place
            torch._dynamo.mark_static_address(cache.k_NBGCE)
            torch._dynamo.mark_static_address(cache.v_NBGCE)

    def __call__(
        self, tokens_BT: torch.Tensor, positions_BT: torch.Tensor, mask: Any, cache: KVCache
    ) -> torch.Tensor:
        forward = self.compiled if tokens_BT.shape[1] == self.n_inputs else self.net
        return forward(tokens_BT, positions_BT, mask, cache)
