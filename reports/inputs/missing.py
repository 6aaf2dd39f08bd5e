"""What the report could not use: `Missing` records, collected while loading (`MissingLog`).

A loader never raises on a bad input; it adds a record (path, problem, kind) and returns an empty
or partial frame, so the report can say exactly what it could not show.
"""

from __future__ import annotations

import dataclasses

import pandas as pd


@dataclasses.dataclass(frozen=True, slots=True)
class Missing:
    """One input the report could not use (or could use only in part)."""

    path: str
    """Path relative to the run root (``file#section`` for a section of a JSON file)."""
    problem: str
    """What is wrong: ``not found``, ``empty``, ``unreadable: ...``, ``no rows for ...``."""
    kind: str
    """Input kind (`KINDS` key): which figures and tables depend on it."""
    optional: bool = False
    """True for inputs the pipeline does not always produce (external baselines, ablations)."""


class MissingLog:
    """Collects `Missing` records while loading."""

    def __init__(self) -> None:
        self.items: list[Missing] = []

    def add(self, path: str, problem: str | None, kind: str, optional: bool = False) -> None:
        if problem is not None:
            self.items.append(Missing(path, problem, kind, optional))


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Non-empty frames stacked (an empty frame when there are none)."""
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
