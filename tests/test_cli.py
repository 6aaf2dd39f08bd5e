"""The ``setdiff`` dispatcher: its stages are the modules of `setdiff.stages`, found, not listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from setdiff import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_commands_are_the_stage_modules_and_the_tools() -> None:
    files = {p.stem for p in (ROOT / "setdiff" / "stages").glob("*.py")} - {"__init__", "common"}
    assert list(cli.commands()) == [*sorted(files), *cli.MODULES]


def test_help_gives_each_command_its_docstring_line(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    for name, module in cli.commands().items():
        text = cli.help_line(module)
        assert text and text[0].isupper() and text.endswith(".") and "``" not in text, name
        assert len(text) <= 90, f"{module}: the help line is {len(text)} characters"
        assert any(line.split() == [name, *text.split()] for line in lines), name


def test_an_unknown_stage_is_one_line_naming_the_choices() -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["trian"])
    message = str(stopped.value.code)
    assert message.count("\n") == 0 and "unknown stage 'trian'" in message
    assert all(name in message for name in ("train", "lossless", "dvc-deps"))


def test_help_imports_no_stage() -> None:
    """The help lines are read with `ast`: ``setdiff --help`` loads no stage and no torch."""
    code = (
        "import sys; from setdiff import cli; cli.main(['--help']);"
        "loaded = [m for m in sys.modules if m.startswith('setdiff.stages.')];"
        "print(loaded, 'torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stderr.strip() == "[] False"
