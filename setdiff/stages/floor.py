"""Check a task's quality floors (AR >= 0.8, setdlm within 10 points); metrics/.

``setdiff floor``: check the quality floors of a run and record the verdict in metrics/.

Reads ``metrics/evaluate/<task>/{ar,setdlm}.json`` (greedy decoding, tau off) and writes
``metrics/floor/<task>.json``: AR exact-match accuracy on the task's test split must be
>= ``ar_min`` and setdlm must be within ``max_gap`` of AR (``study.floor`` lists the tasks). It
records and prints; with ``--strict`` it also exits non-zero when a floor is missed (it is a
benchmark check, not a test).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from setdiff.files import write_json

PARAMS: tuple[str, ...] = ()
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

STUDY = "floor"
"""``study.floor``: the tasks this stage runs on (``floor@<task>``)."""
STUDY_TASKS = "answers"
"""Only tasks with checkable answers."""
STUDY_PARADIGMS = ("ar", "setdlm")
"""Its floors are AR's accuracy and setdlm's gap to it."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", default="arith")
    parser.add_argument("--ar-min", type=float, default=0.8)
    parser.add_argument("--max-gap", type=float, default=0.10)
    parser.add_argument("--root", default=".")
    parser.add_argument("--out", help="default: metrics/floor/<task>.json")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a floor is missed")
    args = parser.parse_args(argv)
    found = {}
    for paradigm in ("ar", "setdlm"):
        path = Path(args.root) / "metrics" / "evaluate" / args.task / f"{paradigm}.json"
        if not path.exists():
            sys.exit(f"setdiff floor: missing {path}; run the evaluate stage first")
        found[paradigm] = json.loads(path.read_text())
        if "accuracy" not in found[paradigm]:
            sys.exit(f"setdiff floor: {path} has no accuracy (n_answers = 0?)")
    ar, setdlm = found["ar"]["accuracy"], found["setdlm"]["accuracy"]
    verdict = {
        "task": args.task,
        "ar_accuracy": ar,
        "setdlm_accuracy": setdlm,
        "gap": ar - setdlm,
        "ar_min": args.ar_min,
        "max_gap": args.max_gap,
        "ar_floor_met": ar >= args.ar_min,
        "setdlm_within_gap": ar - setdlm <= args.max_gap,
        "n_answers": found["ar"]["n_answers"],
    }
    write_json(Path(args.root) / (args.out or f"metrics/floor/{args.task}.json"), verdict)
    print(json.dumps(verdict, indent=2))
    if args.strict and not (verdict["ar_floor_met"] and verdict["setdlm_within_gap"]):
        sys.exit(1)
