"""Durable files: atomic writes (a killed process never leaves a half-written file), strict
JSON, content hashes, and a full disk named in one line. No torch: every stage can use these."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DiskFullError(OSError):
    """ENOSPC naming the output being written (see `naming_full_disk`)."""


def is_disk_full(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from or while handling, is a full disk.

    Libraries wrap ENOSPC: torch's archive writer raises ``unexpected pos`` while handling the
    OSError of its file, safetensors' Rust writer a SafetensorError ending ``(os error 28)``.
    """
    seen: set[int] = set()
    chained: BaseException | None = err
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        if isinstance(chained, OSError) and chained.errno == errno.ENOSPC:
            return True
        if f"(os error {errno.ENOSPC})" in str(chained):
            return True
        chained = chained.__cause__ or chained.__context__
    return False


@contextlib.contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """Re-raise a disk-full error (`is_disk_full`) as a `DiskFullError`, ``no space left on
    device: '<path>'``; one raised by an inner block keeps the path it names."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:
        if not is_disk_full(err):
            raise
        raise DiskFullError(errno.ENOSPC, "no space left on device", str(path)) from err


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success move it over `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with naming_full_disk(path):
            yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are ordinary shared files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_bytes(path: str | Path, payload: bytes) -> None:
    """Write `payload` durably (fsync) and atomically: readers never see a partial file."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any) -> None:
    """A JSON document with sorted keys and a trailing newline, written atomically.

    Strict JSON, as DVC and every reader parse metrics: a NaN or infinity anywhere in `data`
    raises ValueError naming the file and the key path, and nothing is written. A writer whose
    value may honestly be "not computable" says so with `finite_or_none` (null)."""
    bad = next(_non_finite(data, ""), None)
    if bad is not None:
        where, value = bad
        raise ValueError(f"{path}: {where or 'the value'} is {value}: JSON has no NaN/inf")
    write_text(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _non_finite(data: Any, where: str) -> Iterator[tuple[str, float]]:
    """(key path, value) of each NaN/inf in nested dicts and lists."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _non_finite(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list | tuple):
        for i, value in enumerate(data):
            yield from _non_finite(value, f"{where}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        yield where, data


def finite_or_none(data: Any) -> Any:
    """`data` with every NaN/inf (in nested dicts and lists) replaced by None: for values that
    may honestly be not computable (an empty sample, a resumed run with no step left)."""
    if isinstance(data, dict):
        return {key: finite_or_none(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite_or_none(value) for value in data]
    return None if isinstance(data, float) and not math.isfinite(data) else data


def sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces `path` (old one removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with naming_full_disk(path):
            yield tmp
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
