"""The ``gsm8k`` task: the real GSM8K (Cobbe et al., 2021) for the paper-scale preset.

Read from a local copy or, for users with a network, the hub dataset ``openai/gsm8k``
(`setdiff.hub` decides which); target = the reference solution without its calculator
annotations, ending in ``"#### <answer>"``. Scoring is an exact numeric match of the answer after
``####``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from setdiff import hub
from setdiff.config import check, frozen
from setdiff.tasks.gsm import GSM_MARKER
from setdiff.tasks.records import (
    Record,
    Splits,
    derive_seed,
    extract_answer,
    from_jsonl,
    same_number,
)

GSM8K_FILES: tuple[str, ...] = ("main/*.parquet", "*.jsonl")
"""What a GSM8K hub snapshot needs (the ``main`` config; the original release's jsonl)."""
CALCULATOR = re.compile(r"<<[^<>]*>>")
"""GSM8K's calculator annotations, e.g. ``<<48/2=24>>``, dropped from the targets."""


@frozen
class Gsm8kConfig:
    """The real GSM8K: 7473 training and 1319 test problems; valid is carved out of train."""

    source: str = "openai/gsm8k"
    """A local directory (hub layout ``main/{train,test}-*.parquet``, or ``train.jsonl`` and
    ``test.jsonl`` as in the original release), or a hub dataset id fetched when online."""
    n_valid: int = 500
    """Training problems held out for validation (a seeded draw)."""
    n_train: int | None = None
    """Training problems kept (the first after the draw); None keeps all the rest."""
    n_test: int | None = None
    """Test problems kept (file order); None keeps all 1319."""
    template: str = "Question: {question}\nAnswer:\n"
    """The prompt; ``{question}`` is replaced by the problem text. It ends in a newline, not a
    space: prompt and target are tokenized apart, and a trailing space would become a lone space
    token, which a pretrained byte-level BPE model has rarely seen before a word."""

    def __post_init__(self) -> None:
        check(bool(self.source), "source must name a directory or a hub dataset id")
        check(self.n_valid > 0, f"n_valid must be positive, got {self.n_valid}")
        for name, value in (("n_train", self.n_train), ("n_test", self.n_test)):
            check(value is None or value > 0, f"{name} must be positive or null, got {value}")
        check("{question}" in self.template, "template must contain {question}")


def read_gsm8k(source: str) -> dict[str, list[Record]]:
    """``{"train": [...], "test": [...]}`` of ``{question, answer}`` rows, in file order.

    Args:
        source: a local directory holding ``main/<split>-*.parquet`` (hub layout) or
            ``<split>.jsonl``; otherwise a hub dataset id, fetched with
            `huggingface_hub.snapshot_download` (a cache lookup under ``HF_HUB_OFFLINE=1``).
    Raises:
        FileNotFoundError: naming the directory and the layouts looked for.
        ValueError: if rows lack ``question`` or ``answer``.
    """
    directory = hub.resolve(source, patterns=GSM8K_FILES, repo_type="dataset")
    return {split: _read_gsm8k_split(directory, split) for split in ("train", "test")}


def _read_gsm8k_split(directory: Path, split: str) -> list[Record]:
    parquet = sorted(directory.glob(f"main/{split}-*.parquet"))
    if parquet:
        import pyarrow.parquet as pq

        rows = [row for path in parquet for row in pq.read_table(path).to_pylist()]
    elif (directory / f"{split}.jsonl").exists():
        rows = from_jsonl((directory / f"{split}.jsonl").read_text(encoding="utf-8"))
    else:
        raise FileNotFoundError(
            f"{directory}: no GSM8K {split} split (main/{split}-*.parquet or {split}.jsonl)"
        )
    bad = [i for i, row in enumerate(rows) if not {"question", "answer"} <= set(row)]
    if bad:
        raise ValueError(f"{directory} {split}: row {bad[0]} lacks question/answer")
    return [{"question": row["question"], "answer": row["answer"]} for row in rows]


def gsm8k_record(row: Mapping[str, Any], template: str) -> Record:
    """One ``gsm8k`` record: the templated prompt and the annotation-free reference solution."""
    solution = CALCULATOR.sub("", row["answer"]).strip()
    answer = extract_answer(solution, GSM_MARKER)
    if answer is None:
        raise ValueError(f"GSM8K solution without '{GSM_MARKER} <answer>': {row['answer']!r}")
    steps = solution[: solution.rindex(GSM_MARKER)].rstrip()
    return {
        "prompt": template.format(question=row["question"]),
        "target": f"{steps}\n{GSM_MARKER} {answer}",
        "answer": answer,
        "question": row["question"],
        "entry": {"question": row["question"], "answer": answer},
    }


def generate_gsm8k(config: Gsm8kConfig, seed: int) -> Splits:
    """GSM8K splits: test in file order; valid a seeded draw from train; train the rest."""
    rows = read_gsm8k(config.source)
    train = [gsm8k_record(row, config.template) for row in rows["train"]]
    test = [gsm8k_record(row, config.template) for row in rows["test"]]
    check(config.n_valid < len(train), f"n_valid {config.n_valid} >= {len(train)} train rows")
    order = random.Random(derive_seed(seed, "gsm8k")).sample(range(len(train)), len(train))
    valid = [train[i] for i in order[: config.n_valid]]
    rest = [train[i] for i in sorted(order[config.n_valid :])]
    for name, wanted, have in (("n_train", config.n_train, rest), ("n_test", config.n_test, test)):
        check(wanted is None or wanted <= len(have), f"{name} {wanted} > {len(have)} available")
    return {"train": rest[: config.n_train], "valid": valid, "test": test[: config.n_test]}


def score_gsm8k(answer: str | None, entry: Mapping[str, Any]) -> float:
    """1.0 if `answer` equals the reference answer as a number (commas ignored), else 0.0."""
    return float(answer is not None and same_number(answer, str(entry["answer"])))
