"""The `setdiff` command: one sub-command per pipeline stage, mapped in one dict.

Each stage lives in `setdiff/stages/<name>.py` and exposes `main(argv) -> None`; DVC calls
these through this dispatcher (``setdiff <stage> ...``); tools (`MODULES`) work the same way.
`setdiff <stage> --help` explains a stage.

Bad input (a `ConfigError` or other `ValueError`, a missing file, a full disk) is reported as one
line, ``error: <message>``, with exit status 2; ``--debug`` or ``SETDIFF_DEBUG=1`` shows the
traceback instead. Any other exception is an internal error and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Iterator, Sequence

STAGES: dict[str, str] = {
    "preset": "Write params.yaml from params/<name>.yaml (switch the active preset).",
    "prepare": "Generate a task's raw splits (offline) under data/<task>/.",
    "tokenize": "Train a task's tokenizer and encode its splits to fixed-length arrays.",
    "train": "Train one (task, paradigm) model; resumable; writes models/<task>/<paradigm>/.",
    "curve": "Validation accuracy at every evaluation of a training run (training curves).",
    "evaluate": "Held-out likelihood bound / perplexity of one model; writes metrics/.",
    "bench": "Speed-quality sweep of every paradigm on one answer task (batch 1); results/.",
    "baseline": "The AR model served by transformers and vLLM, side by side with ours; results/.",
    "tradeoff": "Headline speed ratios at matched accuracy, with bootstrap CIs; metrics/.",
    "floor": "Check a task's quality floors (AR >= 0.8, setdlm within 10 points); metrics/.",
    "trial": "One ablation trial (train at a reduced budget or load, then decode); result.json.",
    "promote": "Write an ablation study's Pareto configurations into params/<preset>.yaml.",
    "textgen": "Text quality: verse infilling and unconditional generation of one model.",
    "lmeval": "Answer accuracy through lm-evaluation-harness beside our scorer; metrics/lmeval/.",
    "backbone": "Backbone study: AR and setdlm accuracy per backbone variant; metrics/.",
    "seeds": "Seed variance: diffusion accuracy per training seed, mean and sd; metrics/.",
    "setsize": "Set size: setdlm/bd3lm fine-tuned at other set sizes D, accuracy; metrics/.",
    "lossless": "Lossless decoders (setdlm verify) against AR + speculative decoding; metrics/.",
    "summary": "Headline numbers of a run (--write: record metrics/summary.json); ends make run.",
    "dvc-deps": "Check (--check) or write (--write) dvc.yaml's code deps: each stage's imports.",
}

MODULES: dict[str, str] = {"dvc-deps": "setdiff.dvcdeps"}
"""Sub-commands that are tools, not stages (a stage is `setdiff.stages.<name>`)."""


def main(argv: list[str] | None = None) -> None:
    argv, debug = debug_flag(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, STAGES))
        lines = [f"  {name:<{width}}  {text}" for name, text in STAGES.items()]
        print(
            "usage: setdiff [--debug] <stage> [--help] [options]\n\nstages:\n"
            + "\n".join(lines)
            + "\n\n--debug (or SETDIFF_DEBUG=1) shows the traceback of a bad-input error."
        )
        return
    name, rest = argv[0], argv[1:]
    if name not in STAGES:
        sys.exit(f"setdiff: unknown stage {name!r}; choose one of {', '.join(STAGES)}")
    module = importlib.import_module(MODULES.get(name, f"setdiff.stages.{name}"))
    with user_errors(debug):
        module.main(rest)


def debug_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """`argv` without ``--debug``, and whether bad input keeps its traceback (``--debug`` given
    or ``SETDIFF_DEBUG`` set to anything but 0)."""
    debug = "--debug" in argv or os.environ.get("SETDIFF_DEBUG", "0") not in ("", "0")
    return [arg for arg in argv if arg != "--debug"], debug


@contextlib.contextmanager
def user_errors(debug: bool = False) -> Iterator[None]:
    """Report bad input raised in the block (`is_user_error`) as one line, ``error: <message>``,
    and exit with status 2; with `debug`, and for any other error, the traceback stays."""
    try:
        yield
    except (ValueError, OSError) as err:  # ConfigError is a ValueError
        if debug or not is_user_error(err):
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def is_user_error(err: BaseException) -> bool:
    """Bad input (a params value, a file, a full disk): reported in one line. Anything else is
    an internal error and keeps its traceback."""
    if isinstance(err, ValueError | FileNotFoundError):
        return True
    return isinstance(err, OSError) and err.errno == errno.ENOSPC


if __name__ == "__main__":
    main()
