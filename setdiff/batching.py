"""Fixed-length encoded splits in memory, and deterministic batches drawn from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from setdiff.paradigm import Batch


@dataclasses.dataclass(frozen=True, slots=True)
class ArraySplit:
    """An encoded split: ``<bos> context target <eos> <pad>...`` rows of equal length."""

    tokens: torch.Tensor  # (N, L) long
    context_len: torch.Tensor  # (N,) long
    length: torch.Tensor  # (N,) long

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.dim() != 2 or self.context_len.shape != (n,) or self.length.shape != (n,):
            raise ValueError(
                f"inconsistent split arrays: tokens {tuple(self.tokens.shape)}, "
                f"context_len {tuple(self.context_len.shape)}, length {tuple(self.length.shape)}"
            )
        if n == 0:
            raise ValueError("empty split: no examples")
        if bool((self.context_len > self.length).any()) or bool(
            (self.length > self.tokens.shape[1]).any()
        ):
            raise ValueError("split arrays: context_len <= length <= seq_len violated")

    @classmethod
    def load(cls, path: str | Path) -> ArraySplit:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"encoded split {path} does not exist (run the tokenize stage)")
        with np.load(path) as f:
            missing = {"tokens", "context_len", "length"} - set(f.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)}")
            arrays = {
                k: torch.from_numpy(f[k].astype(np.int64))
                for k in ("tokens", "context_len", "length")
            }
        return cls(**arrays)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def batch(self, index: torch.Tensor) -> Batch:
        return Batch(self.tokens[index], self.context_len[index], self.length[index])

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.batch(torch.randint(len(self), (batch_size,), generator=generator))

    def iterate(self, batch_size: int, limit: int | None = None) -> Iterator[Batch]:
        """Sequential batches over the first `limit` examples (all by default)."""
        n = len(self) if limit is None else min(limit, len(self))
        for start in range(0, n, batch_size):
            yield self.batch(torch.arange(start, min(start + batch_size, n)))
