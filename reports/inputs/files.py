"""Tolerant file readers: each returns (content, problem), problem None when the file is usable.

A problem is a short phrase for the report's "Missing inputs" table (``not found``, ``empty``,
``unreadable: ...``, ``missing columns: ...``). Nothing here knows the run layout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from metrics_schema import problems


def read_csv(path: Path, required: Iterable[str] = ()) -> tuple[pd.DataFrame, str | None]:
    """A CSV as a frame, or an empty frame and the reason it cannot be used."""
    if not path.is_file():
        return pd.DataFrame(), "not found"
    if path.stat().st_size == 0:
        return pd.DataFrame(), "empty (0 bytes)"
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        return pd.DataFrame(), f"unreadable: {type(err).__name__}: {err}".strip()
    absent = [c for c in required if c not in frame.columns]
    if absent:
        return pd.DataFrame(), f"missing columns: {', '.join(absent)}"
    if frame.empty:
        return frame, "empty (header only, no rows)"
    return frame, None


def read_json(path: Path) -> tuple[Any, str | None]:
    """A JSON document, or None and the reason it cannot be used."""
    if not path.is_file():
        return None, "not found"
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return None, "empty (0 bytes)"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"unreadable: invalid JSON ({err})"


def read_metrics(path: Path, kind: str) -> tuple[Any, str | None]:
    """A metrics file checked against its kind's schema (`metrics_schema.SCHEMAS`): required
    fields present, numbers finite and within bounds; None and what is wrong when it is not."""
    data, problem = read_json(path)
    if problem is not None:
        return None, problem
    found = problems(kind, data)
    if found:
        more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
        return None, "; ".join(found[:3]) + more
    return data, None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """JSON lines as dicts; unreadable lines are skipped and counted in the problem."""
    if not path.is_file():
        return [], "not found"
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad += 1
    if not records:
        return [], "empty (no records)" if not bad else f"unreadable: {bad} invalid lines"
    return records, (f"partial: {bad} invalid lines skipped" if bad else None)


def read_yaml(path: Path) -> tuple[Any, str | None]:
    """A YAML document, or None and the reason it cannot be used."""
    if not path.is_file():
        return None, "not found"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        return None, f"unreadable: {type(err).__name__}"
    return (data, None) if data else (None, "empty")


def flatten_dict(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a.b": leaf}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flatten_dict(value, f"{name}.")
        else:
            out[name] = value
    return out
