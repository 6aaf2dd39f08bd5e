"""``python -m setdiff.lmeval [lm-eval arguments]``: lm-eval's own CLI with the ``setdiff`` model
type registered and our task directory as ``--include_path`` (unless one is given).

    python -m setdiff.lmeval --model setdiff \\
        --model_args path=models/arith/setdlm,window=4,threshold=0.9 --tasks setdiff_arith

Bad input to the ``setdiff`` model (a model directory of the wrong kind, an unknown decode
option) is reported as one line, ``error: <message>``, with exit status 2 (``--debug`` or
``SETDIFF_DEBUG=1`` keeps the traceback), as the ``setdiff`` command does.
"""

from __future__ import annotations

import sys

from setdiff.lmeval import TASKS_DIR, register


def with_our_tasks(argv: list[str]) -> list[str]:
    """`argv` with ``--include_path`` `TASKS_DIR` unless the caller gives an include path (lm-eval
    takes one; copy our YAMLs and ``utils.py`` into yours to use both)."""
    if not argv or argv[0] in ("-h", "--help"):
        return list(argv)
    if any(arg == "--include_path" or arg.startswith("--include_path=") for arg in argv):
        return list(argv)
    return [*argv, "--include_path", str(TASKS_DIR)]


def main(argv: list[str] | None = None) -> None:
    from lm_eval.__main__ import cli_evaluate

    from setdiff.cli import debug_flag, user_errors

    argv, debug = debug_flag(sys.argv[1:] if argv is None else argv)
    register()
    saved, sys.argv = sys.argv, ["lm-eval", *with_our_tasks(argv)]  # lm-eval parses sys.argv
    try:
        with user_errors(debug):
            cli_evaluate()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
