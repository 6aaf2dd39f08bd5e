"""Where a task's files are, as the library sees them: `TaskFiles`, the protocol that
`setdiff.stages.common.Layout` implements (the library never imports the stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class TaskFiles(Protocol):
    """A task's raw records, tokenizer, encoded splits and trained models."""

    task: str

    @property
    def raw(self) -> Path: ...

    @property
    def tokenizer(self) -> Path: ...

    def encoded(self, split: str) -> Path: ...

    def model(self, paradigm: str | None = None) -> Path: ...
