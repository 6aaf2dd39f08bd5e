"""``python -m setdiff.lmeval [lm-eval arguments]``: lm-eval's own CLI with the ``setdiff`` model
type registered and our task directory as ``--include_path`` (unless one is given).

    python -m setdiff.lmeval --model setdiff \\
        --model_args path=models/arith/setdlm,window=4,threshold=0.9 --tasks setdiff_arith

Bad input to the ``setdiff`` model (a model directory of the wrong kind, an unknown decode
option) is reported as one line, ``error: <message>``, with exit status 2 (``--debug`` or
``SETDIFF_DEBUG=1`` keeps the traceback), as the ``setdiff`` command does.
"""

from __future__ import annotations

import os
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

    from setdiff.cli import is_user_error

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("SETDIFF_DEBUG", "0") not in ("", "0")
    argv = [arg for arg in argv if arg != "--debug"]
    register()
    saved, sys.argv = sys.argv, ["lm-eval", *with_our_tasks(argv)]  # lm-eval parses sys.argv
    try:
        cli_evaluate()
    except (ValueError, OSError) as err:
        if debug or not is_user_error(err):
            raise
        print(f"error: {' '.join(str(err).split()) or type(err).__name__}", file=sys.stderr)
        sys.exit(2)
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
