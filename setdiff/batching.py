"""Fixed-length encoded splits in memory, and deterministic batches drawn from them.

An encoded split file (``data/<task>/encoded/<split>.npz``) is read only after its sha256 matches
the ``manifest.json`` beside it (written by the tokenize stage): a split replaced or damaged
since is refused with one line naming the file, before any compute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from setdiff.paradigm import Batch

MANIFEST_FILE = "manifest.json"


@dataclasses.dataclass(frozen=True, slots=True)
class ArraySplit:
    """An encoded split: ``<bos> context target <eos> <pad>...`` rows of equal length."""

    tokens: torch.Tensor  # (N, L) long
    context_len: torch.Tensor  # (N,) long
    length: torch.Tensor  # (N,) long
    sha256: str | None = dataclasses.field(default=None, compare=False)
    """sha256 of the file it was read from (checked against the manifest); None in memory."""

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
        """Read an encoded split whose sha256 matches the manifest beside it.

        Raises:
            FileNotFoundError: the split does not exist.
            ValueError: one line naming the file: no manifest, a split the manifest does not
                list or whose sha256 differs from it, or a damaged file.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"encoded split {path} does not exist (run the tokenize stage)")
        payload = path.read_bytes()
        sha256 = hashlib.sha256(payload).hexdigest()
        _check_manifest(path, sha256)
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as f:
                arrays = {k: f[k] for k in ("tokens", "context_len", "length") if k in f.files}
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            message = f"{path}: unreadable encoded split ({reason}); {_redo(path)}"
            raise ValueError(message) from None
        missing = {"tokens", "context_len", "length"} - set(arrays)
        if missing:
            raise ValueError(f"{path}: missing arrays {sorted(missing)}")
        arrays = {k: torch.from_numpy(v.astype(np.int64)) for k, v in arrays.items()}
        return cls(**arrays, sha256=sha256)

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


def _check_manifest(path: Path, sha256: str) -> None:
    """Refuse a split that its directory's manifest does not list with this sha256."""
    manifest = path.with_name(MANIFEST_FILE)
    try:
        entry = json.loads(manifest.read_text())["splits"][path.stem]
        expected = entry["sha256"]
    except FileNotFoundError:
        raise ValueError(f"{path}: no {manifest} to check it against; {_redo(path)}") from None
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}: not listed in its manifest {manifest}; {_redo(path)}") from None
    if sha256 != expected:
        raise ValueError(
            f"{path} does not match its manifest (sha256 {sha256[:12]}; {manifest.name} says "
            f"{str(expected)[:12]}); {_redo(path)}"
        )


def _redo(path: Path) -> str:
    """The command that rewrites `path` (``data/<task>/encoded/<split>.npz``)."""
    return f"re-run `dvc repro tokenize@{path.parent.parent.name}`"
