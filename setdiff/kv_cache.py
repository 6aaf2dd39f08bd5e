"""KVCache: preallocated keys/values with explicit per-entry positions.

A forward pass *stages* the keys/values of all its inputs right after the committed entries and
attends over committed + staged. Afterwards the caller commits the first `n` staged entries (the
tokens it decided to keep, which it placed first in the input); the rest (masked queries) are
simply forgotten: they sit past `length` and the next forward overwrites them. So a masked
query's K/V never stays in the cache, and committing costs nothing.

Shapes: N layers, B batch, G kv heads, C capacity, E head dim, T new tokens.
"""

from __future__ import annotations

from typing import Any, Self

import torch


def _layout(model: torch.nn.Module) -> dict[str, Any]:
    """The key/value shape, dtype and device of `model`'s attention layers."""
    config, param = model.config, next(model.parameters())
    return {
        "n_layer": config.n_layer,
        "n_kv_head": config.n_kv_head,
        "head_dim": config.head_dim,
        "dtype": param.dtype,
        "device": param.device,
    }


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
    def for_model(
        cls, model: torch.nn.Module, capacity: int, batch_size: int = 1, **extra: Any
    ) -> Self:
        """A cache of `capacity` entries shaped for `model`; `extra`: a subclass's arguments."""
        return cls(capacity=capacity, batch_size=batch_size, **extra, **_layout(model))

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


class StaticKVCache(KVCache):
    """A `KVCache` whose forwards have static shapes, so that a decode step can be compiled or
    captured as a CUDA graph (`setdiff.sampling.static`).

    Every forward attends over all its slots, ``capacity + slack`` (the caller's mask hides the
    slots past the committed and staged entries), and stages its inputs at slot indices held in
    a tensor, set by `prepare`, rather than at a Python offset that would change the traced graph
    each step. At least `slack` slots past the logical `capacity` hold a forward's padding rows,
    so that entries are dropped from the left exactly as an unpadded `KVCache` of `capacity`
    drops them (committing, cropping and dropping are `KVCache`'s); the slot count is rounded up
    to a multiple of `bucket`, so that decodes of nearby lengths share one shape.
    """

    def __init__(self, *, capacity: int, slack: int = 0, bucket: int = 1, **kwargs: Any) -> None:
        super().__init__(capacity=-(-(capacity + slack) // bucket) * bucket, **kwargs)
        self.capacity = capacity
        self.slots = torch.empty(0, dtype=torch.long, device=self.k_NBGCE.device)
        """The slots the next forward stages its inputs at."""

    @property
    def slot_count(self) -> int:
        """Slots every forward attends over: ``capacity + slack``, rounded up to the bucket."""
        return self.k_NBGCE.shape[3]

    def prepare(self, n_inputs: int) -> None:
        """Set up staging for a forward of `n_inputs` inputs, after the committed entries."""
        if self.length + n_inputs > self.slot_count:
            raise ValueError(
                f"cache overflow: {self.length} committed + {n_inputs} new > "
                f"{self.slot_count} slots; call make_room first"
            )
        device = self.k_NBGCE.device
        self.slots = torch.arange(self.length, self.length + n_inputs, device=device)
        self.staged = n_inputs

    def stage(
        self, layer: int, k_BGTE: torch.Tensor, v_BGTE: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values at the prepared slots; return every slot of the layer."""
        self.k_NBGCE[layer].index_copy_(2, self.slots, k_BGTE)
        self.v_NBGCE[layer].index_copy_(2, self.slots, v_BGTE)
        return self.k_NBGCE[layer], self.v_NBGCE[layer]


class RaggedKVCache:
    """A `KVCache` for a batch whose rows commit different numbers of entries per forward.

    Row b holds ``lengths[b]`` committed entries in slots ``[0, lengths[b])``. A forward feeds T
    inputs per row (padded to the longest row); they are staged at each row's own offset,
    ``[lengths[b], lengths[b] + T)``, and attention runs over slots ``[0, max(lengths) + T)``,
    so the caller's per-row mask must hide a row's slots past its own entries. Committing keeps
    a row's first ``n_b`` staged entries. Rows that finish leave with `keep_rows`.

    `capacity` is each row's logical capacity (entries beyond it are dropped from the left, per
    row, as `KVCache.make_room` does); `slack` extra slots hold the padding of a forward.
    """

    def __init__(
        self,
        *,
        n_layer: int,
        capacities: list[int],
        slack: int,
        n_kv_head: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        size = max(capacities) + slack
        shape = (n_layer, len(capacities), n_kv_head, size, head_dim)
        self.k_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.v_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.positions_BC = torch.full((len(capacities), size), -1, dtype=torch.long)
        self.capacities = list(capacities)
        self.lengths = [0] * len(capacities)
        self.staged = 0
        self._index_B1T1: torch.Tensor | None = None
        self.device = torch.device(device)

    @classmethod
    def for_model(cls, model: torch.nn.Module, capacities: list[int], slack: int) -> RaggedKVCache:
        return cls(capacities=capacities, slack=slack, **_layout(model))

    def make_room(self, row: int, n_new: int) -> int:
        """Drop row `row`'s oldest entries so that `n_new` more fit its capacity."""
        capacity, length = self.capacities[row], self.lengths[row]
        if n_new > capacity:
            raise ValueError(f"{n_new} new tokens exceed the cache capacity {capacity}")
        overflow = length + n_new - capacity
        if overflow <= 0:
            return 0
        keep = length - overflow
        for buf in (self.k_NBGCE, self.v_NBGCE):
            buf[:, row, :, :keep] = buf[:, row, :, overflow:length].clone()
        self.positions_BC[row, :keep] = self.positions_BC[row, overflow:length].clone()
        self.lengths[row] = keep
        return overflow

    def prepare(self, n_inputs: int) -> None:
        """Set up staging for a forward of `n_inputs` (T) inputs per row."""
        if max(self.lengths) + n_inputs > self.k_NBGCE.shape[3]:
            raise ValueError(
                f"cache overflow: {max(self.lengths)} committed + {n_inputs} new > "
                f"{self.k_NBGCE.shape[3]} slots; call make_room first"
            )
        offsets = torch.tensor(self.lengths)[:, None] + torch.arange(n_inputs)  # (B, T)
        self._index_B1T1 = offsets[:, None, :, None].to(self.device)

    def stage(
        self, layer: int, k_BGTE: torch.Tensor, v_BGTE: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new keys/values after its own entries; return slots
        ``[0, max(lengths) + T)`` of every row."""
        index = self._index_B1T1
        if index is None or index.shape[2] != k_BGTE.shape[2]:
            raise ValueError("call prepare(T) before a forward of T inputs")
        index = index.expand(-1, k_BGTE.shape[1], -1, k_BGTE.shape[3])
        self.k_NBGCE[layer].scatter_(2, index, k_BGTE)
        self.v_NBGCE[layer].scatter_(2, index, v_BGTE)
        self.staged = k_BGTE.shape[2]
        end = max(self.lengths) + self.staged
        return self.k_NBGCE[layer, :, :, :end], self.v_NBGCE[layer, :, :, :end]

    def commit(self, row: int, positions: torch.Tensor) -> None:
        """Keep row `row`'s first ``len(positions)`` staged entries (with these positions)."""
        n = int(positions.numel())
        if n > self.staged:
            raise ValueError(f"cannot commit {n} entries: only {self.staged} were staged")
        start = self.lengths[row]
        self.positions_BC[row, start : start + n] = positions.reshape(-1).cpu()
        self.lengths[row] += n

    def crop(self, row: int, length: int) -> None:
        """Forget row `row`'s entries from index `length` on (as `KVCache.crop`)."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"crop length {length} outside [0, {self.lengths[row]}]")
        self.lengths[row] = length

    def end_forward(self) -> None:
        self.staged = 0
        self._index_B1T1 = None

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (finished ones leave the batch), in this order.

        When every row that moves comes from past the kept ones (the order of
        `setdiff.sampling.batch.fill_holes`), only those rows are copied and the buffers are cut
        to a view; any other order gathers every row."""
        n = len(rows)
        moved = [i for i, r in enumerate(rows) if i != r]
        if all(rows[i] >= n for i in moved):
            dst, src = (
                torch.tensor(moved, dtype=torch.long),
                torch.tensor([rows[i] for i in moved], dtype=torch.long),
            )
            on_device = dst.to(self.device), src.to(self.device)
            self.k_NBGCE[:, on_device[0]] = self.k_NBGCE[:, on_device[1]]
            self.v_NBGCE[:, on_device[0]] = self.v_NBGCE[:, on_device[1]]
            self.positions_BC[dst] = self.positions_BC[src]
            self.k_NBGCE, self.v_NBGCE = self.k_NBGCE[:, :n], self.v_NBGCE[:, :n]
            self.positions_BC = self.positions_BC[:n]
        else:
            index = torch.tensor(rows, dtype=torch.long)
            self.k_NBGCE = self.k_NBGCE[:, index.to(self.device)]
            self.v_NBGCE = self.v_NBGCE[:, index.to(self.device)]
            self.positions_BC = self.positions_BC[index]
        self.capacities = [self.capacities[r] for r in rows]
        self.lengths = [self.lengths[r] for r in rows]
