"""End to end: the smoke preset through `dvc repro` in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from checkout import copy_checkout, env, sh


@pytest.fixture
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh git repository holding the tracked files of this checkout."""
    return copy_checkout(tmp_path_factory.mktemp("repo"))


# The tests sharing `smoke` run on one xdist worker (group "smoke", `--dist loadgroup` in the
# Makefile), so the smoke run is built once; each still passes alone (the fixture builds it).
@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A fresh copy after `setdiff preset smoke` and `dvc repro`: the copy and the run."""
    repo = copy_checkout(tmp_path_factory.mktemp("smoke"))
    sh("setdiff", "preset", "smoke", cwd=repo)
    return repo, sh("dvc", "repro", cwd=repo, check=False)


@pytest.mark.slow
@pytest.mark.xdist_group("smoke")
def test_smoke_preset_reproduces_and_second_run_is_a_noop(
    smoke: tuple[Path, subprocess.CompletedProcess],
) -> None:
    repo, run = smoke
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
@pytest.mark.xdist_group("smoke")
def test_the_record_is_readable_portable_and_stable(
    smoke: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """After the smoke run: `setdiff summary` (the end of `make run`) prints the headline in a
    few lines, `dvc metrics show` is one short row, no metrics file names this checkout's path,
    and retraining to the same weights leaves the model's hash, so nothing downstream is stale."""
    repo, run = smoke
    assert run.returncode == 0, run.stderr[-3000:]
    shown = sh("setdiff", "summary", cwd=repo).stdout
    assert "accuracy" in shown and "setdlm" in shown and "x AR (95% CI" in shown, shown
    assert "reports/out/report.md" in shown and "not built" not in shown
    assert len(shown.splitlines()) <= 10 and max(map(len, shown.splitlines())) <= 100
    table = sh("dvc", "metrics", "show", cwd=repo).stdout.splitlines()
    assert len(table) <= 3 and max(map(len, table)) <= 300, table
    for path in sorted((repo / "metrics").rglob("*.json")):
        assert str(repo) not in path.read_text(), path
    before = _out_hash(repo, "train_ar@arith", "models/arith/ar")
    sh("dvc", "repro", "--force", "--single-item", "train_ar@arith", cwd=repo)
    assert _out_hash(repo, "train_ar@arith", "models/arith/ar") == before
    status = sh("dvc", "status", cwd=repo).stdout
    for stage in ("train@arith-setdlm", "evaluate@arith-ar", "bench@arith", "ablate@arith"):
        assert f"{stage}:" not in status, status


def _out_hash(repo: Path, stage: str, path: str) -> str:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return next(out["md5"] for out in lock["stages"][stage]["outs"] if out["path"] == path)


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
        env=env(repo),
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
