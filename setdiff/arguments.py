"""Checks of values users pass to the library's functions: each refuses a bad value with a
`ValueError` naming the argument. A bool is a Python int but never counts as a number here."""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from typing import Any


def is_int(value: Any) -> bool:
    """An integer (Python, NumPy); not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite real number; not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def as_int(value: Any, name: str) -> int:
    """An integer (Python, NumPy or 0-d tensor); bools, floats and strings are refused."""
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise ValueError(f"{name} must be an integer, got {value!r}")


def as_sequence(value: Any, name: str, what: str) -> list[Any]:
    """A list, tuple, range or array of `what` as a list; a lone str or number is refused (a
    str would be split into characters)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of {what}, got {value!r}")
    return list(value)


def per_row(value: Any, n: int, name: str) -> list[int]:
    """One int for every one of `n` rows, or a sequence of one int per row."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if len(value) != n:
            raise ValueError(
                f"{name} must be an int or hold one per prompt ({n}), got {len(value)}"
            )
        return [as_int(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return [as_int(value, name)] * n
