"""End to end: the smoke preset through `dvc repro` in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def sh(*cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=ENV, check=check, capture_output=True, text=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh git repository holding the tracked files of this checkout."""
    dest = tmp_path_factory.mktemp("repo")
    files = sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for p in ("data", "models", "metrics", "checkpoints", "results", "ablations"):
        assert not (dest / p).exists()
    sh("git", "init", "-q", cwd=dest)
    sh("git", "add", "-A", cwd=dest)
    sh("git", "commit", "-qm", "copy", cwd=dest)
    return dest


@pytest.mark.slow
def test_smoke_preset_reproduces_and_second_run_is_a_noop(repo: Path) -> None:
    sh("setdiff", "preset", "smoke", cwd=repo)
    run = sh("dvc", "repro", cwd=repo, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for task in ("arith", "text"):
        for paradigm in ("ar", "mdlm", "bd3lm", "aogpt", "setdlm"):
            metrics = json.loads(
                (repo / "metrics/evaluate" / task / f"{paradigm}.json").read_text()
            )
            assert metrics["ppl"] > 1.0 and metrics["n_tokens"] > 0
            assert (repo / "models" / task / paradigm / "model.safetensors").exists()
    again = sh("dvc", "status", cwd=repo)
    assert "up to date" in again.stdout, again.stdout


@pytest.mark.slow
def test_killed_training_resumes_from_its_checkpoint(repo: Path) -> None:
    """SIGKILL mid-training, then `dvc repro` again: the stage resumes, nothing is lost."""
    sh("setdiff", "preset", "smoke", cwd=repo)
    params = (repo / "params.yaml").read_text()
    # A longer AR run on one task so there is time to kill it between checkpoints.
    params = params.replace("ar: {steps: 40, batch_size: 32", "ar: {steps: 400, batch_size: 32")
    (repo / "params.yaml").write_text(params)
    sh("dvc", "repro", "tokenize@arith", cwd=repo)
    proc = subprocess.Popen(
        ["dvc", "repro", "train_ar@arith"],
        cwd=repo,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt_root = repo / "checkpoints" / "arith" / "ar"
    deadline = time.time() + 240
    while time.time() < deadline and not list(ckpt_root.glob("*/state.pt")):
        time.sleep(0.5)
    assert list(ckpt_root.glob("*/state.pt")), "no checkpoint was written"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (repo / "models" / "arith" / "ar" / "model.safetensors").exists()
    run = sh("dvc", "repro", "train_ar@arith", cwd=repo, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((repo / "metrics/train/arith/ar.json").read_text())
    assert metrics["resumed_from"] > 0 and metrics["steps"] == 400
