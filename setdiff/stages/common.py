"""What every stage shares: argument parsing, logging, the preset and the path layout (`start`).

Path layout (all relative to the repository root, all DVC outputs):
    data/<task>/raw/        prepare      data/<task>/tokenizer/  tokenize
    data/<task>/encoded/    tokenize     models/<task>/<paradigm>/  train
    metrics/<stage>/<task>/<paradigm>.json                        metrics
    checkpoints/<task>/<paradigm>/  resumable training state (scratch, not a DVC output)
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Collection
from pathlib import Path

from setdiff.artifacts import LoadedModel, load_model
from setdiff.config import ConfigError
from setdiff.preset import Preset, load_preset
from setdiff.tasks import ANSWER_TASKS, TASKS, check_task


def parse_args(
    argv: list[str],
    description: str,
    *,
    paradigms: Collection[str] = (),
    answers: bool = False,
) -> argparse.Namespace:
    """``--params``, ``--task``, ``--root``, and ``--paradigm`` (one of `paradigms`) when a stage
    runs one paradigm: it passes the registry (`setdiff.paradigm.PARADIGMS`), so a stage that
    does not, such as prepare, never imports the paradigms (nor, through DVC, depends on them).
    `answers`: the stage scores answers, so ``--task`` must be one with answers."""
    parser = argparse.ArgumentParser(prog="setdiff", description=description)
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default: params.yaml)"
    )
    parser.add_argument("--task", required=True, help=f"task name: {' | '.join(TASKS)}")
    if paradigms:
        parser.add_argument("--paradigm", required=True, help=f"one of {', '.join(paradigms)}")
    parser.add_argument("--root", default=".", help="directory holding data/, models/, metrics/")
    args = parser.parse_args(argv)
    check_task(args.task)
    if answers and args.task not in ANSWER_TASKS:
        raise ConfigError(
            f"--task: {args.task!r} has no answers to score; use {sorted(ANSWER_TASKS)}"
        )
    if paradigms and args.paradigm not in paradigms:
        raise ConfigError(
            f"--paradigm: unknown paradigm {args.paradigm!r}; choose one of {list(paradigms)}"
        )
    return args


def start(
    argv: list[str],
    description: str,
    *,
    paradigms: Collection[str] = (),
    answers: bool = False,
) -> tuple[argparse.Namespace, Preset, Layout]:
    """How a stage begins: its arguments (`parse_args`), logging, the preset (each section is
    validated as the stage reads it) and the paths of its task (and paradigm)."""
    args = parse_args(argv, description, paradigms=paradigms, answers=answers)
    setup_logging()
    layout = Layout(args.root, args.task, getattr(args, "paradigm", ""))
    return args, load_preset(args.params), layout


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def snapshot_name(step: int) -> str:
    """The file of a training snapshot of `step` (`Layout.snapshots`)."""
    return f"{step:06d}.safetensors"


class Layout:
    """Paths of one (task, paradigm) cell under `root`."""

    def __init__(self, root: str | Path, task: str, paradigm: str = "") -> None:
        self.root, self.task, self.paradigm = Path(root), task, paradigm

    @property
    def raw(self) -> Path:
        return self.root / "data" / self.task / "raw"

    @property
    def tokenizer(self) -> Path:
        return self.root / "data" / self.task / "tokenizer" / "tokenizer.json"

    def encoded(self, split: str) -> Path:
        return self.root / "data" / self.task / "encoded" / f"{split}.npz"

    def model(self, paradigm: str | None = None) -> Path:
        return self.root / "models" / self.task / (paradigm or self.paradigm)

    def load_model(self, device: str = "cpu") -> LoadedModel:
        """This cell's trained model, checked to be of its task, paradigm and tokenizer."""
        return load_model(
            self.model(), device, paradigm=self.paradigm, task=self.task, tokenizer=self.tokenizer
        )

    def metrics(self, stage: str) -> Path:
        return self.root / "metrics" / stage / self.task / f"{self.paradigm}.json"

    @property
    def snapshots(self) -> Path:
        """The weights of every evaluation of a training run (`setdiff.stages.train`), one
        `snapshot_name` file each, and ``steps.json``, their steps (the curve stage decodes
        them)."""
        return self.root / "snapshots" / self.task / self.paradigm

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints" / self.task / self.paradigm
