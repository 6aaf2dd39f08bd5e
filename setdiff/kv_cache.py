"""KVCache: preallocated keys/values of committed tokens, post-RoPE, per row in commit order.

One cache for one prompt or a batch, eager or static (one shape whatever its lengths, for a
compiled step: staged at slot indices held in a tensor, slots rounded up to `bucket`). A forward
stages its inputs' K/V after each row's own entries; the caller commits a row's first `n` of them
and the rest are overwritten by the next forward. See docs/design.md, "The decode engine".

Shapes: N layers, B rows, G kv heads, C slots, E head dim, T new tokens.
"""

from __future__ import annotations

from typing import Any, Self

import torch


class KVCache:
    """Keys/values of committed tokens per row; see the module docstring."""

    def __init__(
        self,
        *,
        n_layer: int,
        n_kv_head: int,
        head_dim: int,
        capacities: list[int],
        slack: int = 0,
        bucket: int = 1,
        static: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        size = -(-(max(capacities) + slack) // bucket) * bucket
        shape = (n_layer, len(capacities), n_kv_head, size, head_dim)
        self.k_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.v_NBGCE = torch.zeros(shape, dtype=dtype, device=device)
        self.capacities = list(capacities)
        """Each row's logical capacity: entries beyond it are dropped from the left."""
        self.lengths = [0] * len(capacities)
        self.static = static
        self.device = torch.device(device)
        self.staged = 0
        """Inputs per row staged by the forward under way (0: none)."""
        self.dropped = 0
        """Entries dropped from the left on overflow, over the cache's lifetime."""
        self._slots_BT: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model: torch.nn.Module, capacity: int | list[int], **extra: Any) -> Self:
        """A cache shaped for `model`, of one row (`capacity` an int) or one row per capacity;
        `extra`: ``slack``, ``bucket``, ``static``."""
        config, param = model.config, next(model.parameters())
        return cls(
            n_layer=config.n_layer,
            n_kv_head=config.n_kv_head,
            head_dim=config.head_dim,
            capacities=[capacity] if isinstance(capacity, int) else list(capacity),
            dtype=param.dtype,
            device=param.device,
            **extra,
        )

    @property
    def length(self) -> int:
        """A one-row cache's committed entries."""
        return self.lengths[0]

    @property
    def slot_count(self) -> int:
        """Slots per row (a static cache's forwards attend over all of them)."""
        return self.k_NBGCE.shape[3]

    def make_room(self, n_new: int, row: int = 0) -> int:
        """Drop the row's oldest entries so that `n_new` more fit its capacity; returns how many
        were dropped."""
        capacity, length = self.capacities[row], self.lengths[row]
        if n_new > capacity:
            raise ValueError(f"{n_new} new tokens exceed the cache capacity {capacity}")
        overflow = length + n_new - capacity
        if overflow <= 0:
            return 0
        keep = length - overflow
        for buf in (self.k_NBGCE, self.v_NBGCE):
            buf[:, row, :, :keep] = buf[:, row, :, overflow:length].clone()
        self.lengths[row] = keep
        self.dropped += overflow
        return overflow

    def prepare(self, n_inputs: int) -> None:
        """Set up staging for a forward of `n_inputs` (T) inputs per row, each after its row's
        own entries. A forward may skip it (its first `stage` calls it)."""
        if max(self.lengths) + n_inputs > self.slot_count:
            raise ValueError(
                f"cache overflow: {max(self.lengths)} committed + {n_inputs} new > "
                f"{self.slot_count} slots; call make_room first"
            )
        self.staged, self._slots_BT = n_inputs, None  # rows at one offset: staged by slicing
        if self.static or len(set(self.lengths)) > 1:
            offsets = torch.tensor(self.lengths)[:, None] + torch.arange(n_inputs)
            self._slots_BT = offsets.to(self.device)

    def stage(
        self, layer: int, k_BGTE: torch.Tensor, v_BGTE: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new keys/values after its own entries; return the slots the forward
        attends over: ``[0, max(lengths) + T)`` of every row (static: every slot)."""
        T = k_BGTE.shape[2]
        if layer == 0 and T != self.staged:
            self.prepare(T)
        if T != self.staged:
            raise ValueError("call prepare(T) before a forward of T inputs")
        if self._slots_BT is None:
            start = self.lengths[0]
            self.k_NBGCE[layer, :, :, start : start + T] = k_BGTE
            self.v_NBGCE[layer, :, :, start : start + T] = v_BGTE
        else:
            G, E = k_BGTE.shape[1], k_BGTE.shape[3]
            index = self._slots_BT[:, None, :, None].expand(-1, G, -1, E)
            self.k_NBGCE[layer].scatter_(2, index, k_BGTE)
            self.v_NBGCE[layer].scatter_(2, index, v_BGTE)
        if self.static:
            return self.k_NBGCE[layer], self.v_NBGCE[layer]
        end = max(self.lengths) + T
        return self.k_NBGCE[layer, :, :, :end], self.v_NBGCE[layer, :, :, :end]

    def commit(self, n: int, row: int = 0) -> None:
        """Keep the row's first `n` staged entries. A one-row cache's forward ends here; a
        batch's at `end_forward`."""
        if n > self.staged:
            raise ValueError(f"cannot commit {n} entries: only {self.staged} were staged")
        self.lengths[row] += n
        if len(self.lengths) == 1:
            self.end_forward()

    def end_forward(self) -> None:
        self.staged, self._slots_BT = 0, None

    def crop(self, length: int, row: int = 0) -> None:
        """Forget the row's entries from index `length` on."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"crop length {length} outside [0, {self.lengths[row]}]")
        self.lengths[row] = length
        self.end_forward()

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (finished ones leave the batch), in this order.

        When every row that moves comes from past the kept ones (the order of
        `setdiff.sampling.engine.fill_holes`), only those rows are copied and the buffers are
        cut to a view; any other order gathers every row."""
        n = len(rows)
        moved = [i for i, r in enumerate(rows) if i != r]
        if all(rows[i] >= n for i in moved):
            dst = torch.tensor(moved, dtype=torch.long, device=self.device)
            src = torch.tensor([rows[i] for i in moved], dtype=torch.long, device=self.device)
            self.k_NBGCE[:, dst] = self.k_NBGCE[:, src]
            self.v_NBGCE[:, dst] = self.v_NBGCE[:, src]
            self.k_NBGCE, self.v_NBGCE = self.k_NBGCE[:, :n], self.v_NBGCE[:, :n]
        else:
            index = torch.tensor(rows, dtype=torch.long, device=self.device)
            self.k_NBGCE, self.v_NBGCE = self.k_NBGCE[:, index], self.v_NBGCE[:, index]
        self.capacities = [self.capacities[r] for r in rows]
        self.lengths = [self.lengths[r] for r in rows]
