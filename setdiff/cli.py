"""The `setdiff` command: one sub-command per pipeline stage, mapped in one dict.

Each stage lives in `setdiff/stages/<name>.py` and exposes `main(argv) -> None`; DVC calls
these through this dispatcher (``setdiff <stage> ...``). `setdiff <stage> --help` explains a stage.
"""

from __future__ import annotations

import importlib
import sys

STAGES: dict[str, str] = {
    "preset": "Write params.yaml from params/<name>.yaml (switch the active preset).",
    "prepare": "Generate a task's raw splits (offline) under data/<task>/.",
    "tokenize": "Train a task's tokenizer and encode its splits to fixed-length arrays.",
    "train": "Train one (task, paradigm) model; resumable; writes models/<task>/<paradigm>/.",
    "evaluate": "Held-out likelihood bound / perplexity of one model; writes metrics/.",
    "bench": "Speed-quality sweep of every paradigm on one answer task (batch 1); results/.",
    "baseline": "The AR model served by transformers and vLLM, side by side with ours; results/.",
    "tradeoff": "Headline speed ratios at matched accuracy, with bootstrap CIs; metrics/.",
    "floor": "Check a task's quality floors (AR >= 0.8, setdlm within 10 points); metrics/.",
    "trial": "One ablation trial (train at a reduced budget or load, then decode); result.json.",
    "promote": "Write an ablation study's Pareto configurations into params/<preset>.yaml.",
    "textgen": "Text quality: verse infilling and unconditional generation of one model.",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, STAGES))
        lines = [f"  {name:<{width}}  {text}" for name, text in STAGES.items()]
        print("usage: setdiff <stage> [--help] [options]\n\nstages:\n" + "\n".join(lines))
        return
    name, rest = argv[0], argv[1:]
    if name not in STAGES:
        sys.exit(f"setdiff: unknown stage {name!r}; choose one of {', '.join(STAGES)}")
    module = importlib.import_module(f"setdiff.stages.{name}")
    module.main(rest)


if __name__ == "__main__":
    main()
