"""The GPU check script's logic, run on CPU (bf16 autocast works on CPU too); and on CUDA if any."""

from __future__ import annotations

import json
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
            "--out",
            str(out),
        ]
    )
    return json.loads(out.read_text())


def _check(report: dict) -> None:
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
