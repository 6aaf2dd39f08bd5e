"""Task records and splits: what every task shares once its generator has produced rows.

A record is a plain, JSON-serialisable dict; a task turns its config and a seed into three
`Splits` (``train``/``valid``/``test``). Here live the shared split machinery (seed derivation,
prompt-unique assignment to splits), answer extraction, and the JSONL form of records on disk
(`to_jsonl`, `from_jsonl`, and the validating `read_record_file`). Which fields a record needs is
decided by its task's layout (`RECORD_KEYS`); which task has which layout is the registry's
business (`setdiff.tasks`), not this module's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from setdiff.config import check

Record = dict[str, Any]
Splits = dict[str, list[Record]]
Layout = Literal["pairs", "stream"]

SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "test")

RECORD_KEYS: dict[Layout, tuple[str, ...]] = {"pairs": ("prompt", "target"), "stream": ("text",)}
"""Task layout -> the string fields every record of that layout needs."""


# ---------------------------------------------------------------------------------------------
# split generation


def check_counts(n_train: int, n_valid: int, n_test: int) -> None:
    """Raise `ValueError` naming the count unless all three split sizes are positive."""
    check(n_train > 0, f"n_train must be positive, got {n_train}")
    check(n_valid > 0, f"n_valid must be positive, got {n_valid}")
    check(n_test > 0, f"n_test must be positive, got {n_test}")


def derive_seed(seed: int, task: str) -> int:
    """A 32-bit generator seed for `task`, decorrelated from neighbouring seeds and tasks."""
    # reasoning-gym builds item i from Random(seed + i), so seeds s and s + 1 would give the same
    # stream shifted by one item; hashing decorrelates neighbouring seeds and tasks.
    digest = hashlib.sha256(f"setdiff:{task}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def attempt_budget(needed: int) -> int:
    """How many generator draws to allow for `needed` distinct prompts."""
    return 4 * needed + 1000


def json_safe(value: Any) -> Any:
    """`value` as JSON round-trips it (tuples become lists, other objects their `str`)."""
    # Generator metadata holds tuples and fractions.Fraction; store what JSON round-trips to.
    return json.loads(json.dumps(value, default=str))


def split_counts(n_train: int, n_valid: int, n_test: int) -> dict[str, int]:
    """``{split name: size}`` for `assign_unique`."""
    return {"train": n_train, "valid": n_valid, "test": n_test}


def assign_unique(records: Iterator[Record], counts: Mapping[str, int], task: str) -> Splits:
    """Take records with unseen prompts until `counts` are met: test first, then valid, train.

    Filling test and valid first keeps them fixed when only ``n_train`` changes.

    Raises:
        ValueError: naming `task`, if `records` runs out before enough distinct prompts.
    """
    needed = sum(counts.values())
    seen: set[str] = set()
    unique: list[Record] = []
    attempts = 0
    for record in records:
        attempts += 1
        if record["prompt"] not in seen:
            seen.add(record["prompt"])
            unique.append(record)
            if len(unique) == needed:
                break
    if len(unique) < needed:
        raise ValueError(
            f"{task}: only {len(unique)} distinct prompts in {attempts} draws, {needed} needed; "
            "lower n_train/n_valid/n_test or widen the generator ranges"
        )
    splits: Splits = {}
    start = 0
    for name in ("test", "valid", "train"):
        splits[name] = unique[start : start + counts[name]]
        start += counts[name]
    return {name: splits[name] for name in SPLIT_NAMES}


# ---------------------------------------------------------------------------------------------
# answers


def extract_answer(text: str, marker: str = "#") -> str | None:
    """What follows the last `marker` in `text`, stripped; None if absent or empty.

    The default ``"#"`` (the arith marker) also works for gsm text, whose ``"####"`` ends in
    ``"#"``.
    """
    index = text.rfind(marker)
    if index < 0:
        return None
    return text[index + len(marker) :].strip() or None


def same_number(answer: str, oracle: str) -> bool:
    """Whether `answer` and `oracle` are equal as decimal numbers (commas ignored)."""
    try:
        return Decimal(answer.strip().replace(",", "")) == Decimal(oracle.replace(",", ""))
    except InvalidOperation:
        return False


# ---------------------------------------------------------------------------------------------
# JSONL


def to_jsonl(records: Sequence[Record]) -> bytes:
    """Records as UTF-8 JSON lines with sorted keys: identical records give identical bytes."""
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records]
    return "".join(lines).encode("utf-8")


def from_jsonl(data: bytes | str) -> list[Record]:
    """The inverse of `to_jsonl`."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_record_file(path: str | Path, task: str, layout: Layout) -> list[Record]:
    """The records of a raw split file of `task`, each checked for its `layout`'s fields.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: naming file and line, for a line that is not a JSON object or a record that
            lacks a string field the layout needs (`RECORD_KEYS`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing raw split {path}: run `setdiff prepare --task {task}`")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    keys = RECORD_KEYS[layout]
    return [
        _parse_record(line, keys, f"{path}:{number}")
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def _parse_record(line: str, keys: tuple[str, ...], where: str) -> Record:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in keys if key not in record]
    if missing:
        raise ValueError(f"{where}: record lacks {missing} (has {sorted(record)})")
    wrong = [key for key in keys if not isinstance(record[key], str)]
    if wrong:
        raise ValueError(f"{where}: record field {wrong[0]!r} must be a string")
    return record
