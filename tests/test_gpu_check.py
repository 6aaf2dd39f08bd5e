"""The GPU check script's logic, run on CPU (bf16 autocast works on CPU too); and on CUDA if any."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from setdiff.bench import gpu


def _run(device: str, tmp_path: Path) -> dict:
    out = tmp_path / "gpu.json"
    gpu.main(
        [
            "--device",
            device,
            "--dtype",
            "bfloat16",
            "--size",
            "tiny",
            "--steps",
            "3",
            "--batch",
            "4",
            "--new-tokens",
            "16",
            "--repeats",
            "1",
            "--context",
            "16",
            "--batch-sizes",
            "1,3",
            "--n-prompts",
            "5",
            "--throughput-sizes",
            "tiny",
            "--out",
            str(out),
        ]
    )
    return json.loads(out.read_text())


def _check(report: dict) -> None:
    assert report["finished"] and not report["skipped"]
    assert set(report["section_seconds"]) == set(gpu.SECTIONS)
    for name in ("ar/tiny", "setdlm/tiny"):
        r = report["throughput"][name]
        assert r["tokens_per_second"] > 0 and r["model_flops_per_second"] > 0, name
    # setdlm trains on [clean ; masked]: twice the tokens processed per sequence
    setdlm = report["throughput"]["setdlm/tiny"]
    assert setdlm["processed_tokens_per_second"] == pytest.approx(2 * setdlm["tokens_per_second"])
    assert {k.split("/")[0] for k in report["train"]} == {"ar", "mdlm", "bd3lm", "aogpt", "setdlm"}
    assert all(r["finite"] for r in report["train"].values())
    compiled = report["train"]["setdlm/compile"]
    assert compiled["max_loss_diff_vs_sdpa_eager"] < 0.05  # bf16 autocast: rounding, not bugs
    assert report["train"]["setdlm"]["max_loss_diff_vs_sdpa_eager"] == 0.0
    for name, r in report["cache"].items():
        assert r["same_tokens"] and r["max_logit_diff"] < 1e-4, name
    assert {"ar", "bd3lm", "setdlm", "setdlm_recompute"} <= set(report["decode"])
    assert report["decode"]["cached_vs_recompute"] > 0
    for key in ("ar", "setdlm", "setdlm_tau0.9"):  # the compiled static step decodes the same
        assert report["decode"][f"{key}_compiled"]["equals_eager"], key
    step = report["step"]
    # The compiled forward computes the eager one (float32: rounding only).
    assert step["max_logit_diff_compiled_ar"] < 1e-4 and step["max_logit_diff_compiled_set"] < 1e-4
    assert step["set_inputs"] == 8 and step["step_cost_ratio"] > 0
    batched = report["batched"]
    for method in ("ar", "setdlm_tau0.9"):  # rows of a batch of 3 (5 prompts: 3 + 2) = batch 1
        assert all(r["rows_equal_smallest_batch"] for r in batched[method].values()), method
    assert batched["setdlm_tau0.9"]["3"]["ratio_to_ar"] > 0


@pytest.mark.slow
def test_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    _check(_run("cpu", tmp_path))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_on_cuda(tmp_path: Path) -> None:
    _check(_run("cuda", tmp_path))


def test_each_section_is_written_as_it_finishes(tmp_path: Path) -> None:
    """Killed mid-run (SIGKILL, as a slot that runs out), the file holds every finished section,
    readable, and says the run did not finish."""
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--size", "tiny", "--new-tokens", "16", "--repeats", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "setdiff.bench.gpu", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    report = json.loads(out.read_text())
    assert report["finished"] is False
    assert list(report["section_seconds"]) == ["cache"]
    assert all(r["same_tokens"] for r in report["cache"].values())
    assert "step" not in report


def test_sections_past_the_budget_are_skipped_and_named(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    gpu.main(["--device", "cpu", "--size", "tiny", "--budget", "0", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["finished"] and set(report["skipped"]) == set(gpu.SECTIONS)
    assert not report["section_seconds"]


def test_unknown_section_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpu.main(["--device", "cpu", "--sections", "cache,warp", "--out", str(tmp_path / "g")])
    assert exit_info.value.code == 2
    assert "--sections: unknown ['warp']" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()
