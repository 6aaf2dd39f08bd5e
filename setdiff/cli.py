"""The `setdiff` command: one sub-command per pipeline stage, found, not listed.

Each stage lives in `setdiff/stages/<name>.py` and exposes `main(argv) -> None`; every module
there is a sub-command (`setdiff.stages.stage_names`), its docstring's first line its help line.
DVC calls these through this dispatcher (``setdiff <stage> ...``); tools (`MODULES`) work the
same way. `setdiff <stage> --help` explains a stage.

Bad input (a `ConfigError` or other `ValueError`, a missing file, a full disk) is reported as one
line, ``error: <message>``, with exit status 2; ``--debug`` or ``SETDIFF_DEBUG=1`` shows the
traceback instead. Any other exception is an internal error and keeps its traceback.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from setdiff.stages import stage_names

MODULES: dict[str, str] = {"dvc-deps": "setdiff.dvcdeps"}
"""Sub-commands that are tools, not stages (a stage is `setdiff.stages.<name>`)."""


def commands() -> dict[str, str]:
    """Sub-command -> module: every stage (`setdiff.stages.stage_names`), then the tools."""
    return {**{name: f"setdiff.stages.{name}" for name in stage_names()}, **MODULES}


def help_line(module: str) -> str:
    """The first line of `module`'s docstring, read with `ast` (importing every stage to print
    the help would load torch)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"setdiff: no module {module}")
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return doc.partition("\n")[0]


def main(argv: list[str] | None = None) -> None:
    argv, debug = debug_flag(sys.argv[1:] if argv is None else argv)
    known = commands()
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, known))
        lines = [f"  {name:<{width}}  {help_line(module)}" for name, module in known.items()]
        print(
            "usage: setdiff [--debug] <stage> [--help] [options]\n\nstages:\n"
            + "\n".join(lines)
            + "\n\n--debug (or SETDIFF_DEBUG=1) shows the traceback of a bad-input error."
        )
        return
    name, rest = argv[0], argv[1:]
    if name not in known:
        sys.exit(f"setdiff: unknown stage {name!r}; choose one of {', '.join(known)}")
    module = importlib.import_module(known[name])
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
