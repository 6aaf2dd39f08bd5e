"""What every stage shares: argument parsing, the path layout, and the model-shape section.

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
from typing import Any

from setdiff.config import ConfigError, build, check, frozen
from setdiff.model import ModelConfig
from setdiff.paradigm import PARADIGMS
from setdiff.params import Params
from setdiff.tasks import TASK_LAYOUTS, check_task


def parse_args(argv: list[str], description: str, *, paradigm: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="setdiff", description=description)
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default: params.yaml)"
    )
    parser.add_argument("--task", required=True, help="task name: arith | gsm | text")
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


def model_config(params: Params, task: str, vocab_size: int, seq_len: int) -> ModelConfig:
    """`model.<task>` plus the vocabulary and context derived from the tokenized data, or the
    config of the checkpoint named by ``model.<task>.pretrained`` (its own vocabulary)."""
    source = pretrained_source(params, task)
    if source is not None:
        from setdiff.hf import pretrained_config

        return pretrained_config(source, seq_len)
    section = dict(params.get_path(f"model.{task}"))
    derived = sorted({"vocab_size", "max_seq_len"} & set(section))
    if derived:
        raise ConfigError(
            f"{params.path}: model.{task}: {derived} are derived from the tokenizer and "
            "seq_len; remove them"
        )
    return build(
        ModelConfig,
        {**section, "vocab_size": vocab_size, "max_seq_len": seq_len},
        f"{params.path}: model.{task}",
    )


def pretrained_source(params: Params, task: str) -> str | None:
    """``model.<task>.pretrained`` (a Hugging Face checkpoint directory or hub id), or None.

    Raises:
        ConfigError: if other keys sit beside it (the checkpoint fixes the architecture).
    """
    section = params.get_path(f"model.{task}")
    if not isinstance(section, dict) or "pretrained" not in section:
        return None
    others = sorted(set(section) - {"pretrained"})
    if others:
        raise ConfigError(
            f"{params.path}: model.{task}: {others} come from the pretrained checkpoint; "
            "remove them"
        )
    source = section["pretrained"]
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{params.path}: model.{task}.pretrained: expected a path or hub id")
    return source


def paradigm_config(params: Params, name: str) -> Any:
    return params.section(f"paradigm.{name}", PARADIGMS[name][0])


@frozen
class StudyConfig:
    """Which cells the pipeline runs (read by dvc.yaml's foreach/matrix)."""

    tasks: tuple[str, ...]
    paradigms: tuple[str, ...] = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
    """Every trained paradigm; `ar` is required (it is the baseline and the initialisation)."""
    diffusion: tuple[str, ...] = ("mdlm", "bd3lm", "aogpt", "setdlm")
    """The paradigms other than `ar`, trained after it (dvc.yaml cannot compute this list)."""
    floor: tuple[str, ...] = ()
    """Answer tasks whose quality floors (AR accuracy, setdlm gap) are checked: ``floor@<task>``."""
    ablate: tuple[str, ...] = ()
    """Answer tasks the Optuna ablation (``ablation`` section) runs on: ``ablate@<task>``."""
    textgen: tuple[str, ...] = ()
    """Text tasks judged for infilling and unconditional generation: ``textgen@<task>-<p>``."""
    backbone: tuple[str, ...] = ()
    """Answer tasks the backbone study (``backbone`` section) runs on: ``backbone@<task>``."""

    def __post_init__(self) -> None:
        check(len(self.tasks) > 0, "tasks must not be empty")
        for task in self.tasks:
            check_task(task)
        unknown = [p for p in self.paradigms if p not in PARADIGMS]
        check(not unknown, f"paradigms: unknown paradigms {unknown}; known {list(PARADIGMS)}")
        check("ar" in self.paradigms, "paradigms must include ar")
        expected = [p for p in self.paradigms if p != "ar"]
        check(
            list(self.diffusion) == expected,
            f"diffusion must list paradigms without ar, in order: {expected}",
        )
        for name in ("floor", "ablate", "textgen", "backbone"):
            outside = [t for t in getattr(self, name) if t not in self.tasks]
            check(not outside, f"{name}: {outside} not in tasks {list(self.tasks)}")
        check(
            not self.floor or {"ar", "setdlm"} <= set(self.paradigms),
            "floor compares ar and setdlm: both must be in paradigms",
        )
        streams = [t for t in self.textgen if TASK_LAYOUTS[t] != "stream"]
        check(not streams, f"textgen: {streams} are not text (stream) tasks")
