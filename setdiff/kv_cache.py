"""KVCache: preallocated keys/values with explicit per-entry positions.

A forward pass *stages* the keys/values of all its inputs right after the committed entries and
attends over committed + staged. Afterwards the caller commits the first `n` staged entries (the
tokens it decided to keep, which it placed first in the input); the rest (masked queries) are
simply forgotten: they sit past `length` and the next forward overwrites them. So a masked
query's K/V never stays in the cache, and committing costs nothing.

Shapes: N layers, B batch, G kv heads, C capacity, E head dim, T new tokens.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys/values of committed tokens, post-RoPE, in commit order."""

    def __init__(
        self,
        *,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layer, batch_size, n_kv_head, capacity, head_dim)
        self.k_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.v_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.positions_C = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.capacity = capacity
        self.length = 0
        self.staged = 0
        self.dropped = 0
        """Entries dropped from the left on overflow, over the cache's lifetime."""

    @classmethod
    def for_model(cls, model: torch.nn.Module, capacity: int, batch_size: int = 1) -> KVCache:
        config = model.config
        param = next(model.parameters())
        return cls(
            n_layer=config.n_layer,
            batch_size=batch_size,
            n_kv_head=config.n_kv_head,
            head_dim=config.head_dim,
            capacity=capacity,
            dtype=param.dtype,
            device=param.device,
        )

    @property
    def positions(self) -> torch.Tensor:
        """(length,) true positions of the committed entries, in commit order."""
        return self.positions_C[: self.length]

    def make_room(self, n_new: int) -> int:
        """Drop the oldest entries so that `n_new` more fit; returns how many were dropped."""
        if n_new > self.capacity:
            raise ValueError(f"{n_new} new tokens exceed the cache capacity {self.capacity}")
        overflow = self.length + n_new - self.capacity
        if overflow <= 0:
            return 0
        keep = self.length - overflow
        for buf in (self.k_NBGCE, self.v_NBGCE):
            buf[:, :, :, :keep] = buf[:, :, :, overflow : self.length].clone()
        self.positions_C[:keep] = self.positions_C[overflow : self.length].clone()
        self.length = keep
        self.dropped += overflow
        return overflow

    def stage(
        self, layer: int, k_BGTE: torch.Tensor, v_BGTE: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys/values after the committed ones; return committed + staged views."""
        end = self.length + k_BGTE.shape[2]
        if end > self.capacity:
            raise ValueError(
                f"cache overflow: {self.length} committed + {k_BGTE.shape[2]} new > capacity "
                f"{self.capacity}; call make_room first"
            )
        self.k_NBGCE[layer, :, :, self.length : end] = k_BGTE
        self.v_NBGCE[layer, :, :, self.length : end] = v_BGTE
        self.staged = k_BGTE.shape[2]
        return self.k_NBGCE[layer, :, :, :end], self.v_NBGCE[layer, :, :, :end]

    def commit(self, positions: torch.Tensor) -> None:
        """Keep the first ``len(positions)`` staged entries (with these true positions)."""
        n = int(positions.numel())
        if n > self.staged:
            raise ValueError(f"cannot commit {n} entries: only {self.staged} were staged")
        self.positions_C[self.length : self.length + n] = positions.reshape(-1)
        self.length += n
        self.staged = 0

    def crop(self, length: int) -> None:
        """Forget every entry from index `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length {length} outside [0, {self.length}]")
        self.length = length
        self.staged = 0
