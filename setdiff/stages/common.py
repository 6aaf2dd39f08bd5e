"""What every stage shares: argument parsing, logging and the path layout.

Path layout (all relative to the repository root, all DVC outputs):
    data/<task>/raw/        prepare      data/<task>/tokenizer/  tokenize
    data/<task>/encoded/    tokenize     models/<task>/<paradigm>/  train
    metrics/<stage>/<task>/<paradigm>.json                        metrics
    checkpoints/<task>/<paradigm>/  resumable training state (scratch, not a DVC output)
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from setdiff.config import ConfigError
from setdiff.paradigm import PARADIGMS
from setdiff.tasks import TASKS, check_task


def parse_args(argv: list[str], description: str, *, paradigm: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="setdiff", description=description)
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default: params.yaml)"
    )
    parser.add_argument("--task", required=True, help=f"task name: {' | '.join(TASKS)}")
    if paradigm:
        parser.add_argument("--paradigm", required=True, help=f"one of {', '.join(PARADIGMS)}")
    parser.add_argument("--root", default=".", help="directory holding data/, models/, metrics/")
    args = parser.parse_args(argv)
    check_task(args.task)
    if paradigm and args.paradigm not in PARADIGMS:
        raise ConfigError(
            f"--paradigm: unknown paradigm {args.paradigm!r}; choose one of {list(PARADIGMS)}"
        )
    return args


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


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

    def metrics(self, stage: str) -> Path:
        return self.root / "metrics" / stage / self.task / f"{self.paradigm}.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints" / self.task / self.paradigm
