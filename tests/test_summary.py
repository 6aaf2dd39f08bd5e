"""`setdiff summary`: the headline numbers of a run in a few short lines (what `make run` ends
with), recorded in a flat `metrics/summary.json` (the file `dvc metrics show` prints)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from setdiff.config import ConfigError
from setdiff.stages import summary

ROOT = Path(__file__).resolve().parents[1]
PARADIGMS = ("ar", "mdlm", "bd3lm", "aogpt", "setdlm")
ACCURACY = {"ar": 0.93, "mdlm": 0.61, "bd3lm": 0.82, "aogpt": 0.7, "setdlm": 0.91}
VLLM_ENTRY = {"engine_over_own_ar": 1.25, "ci95": [1.1, 1.4], "setdlm_vs_vllm": 1.5}


def _json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def evaluate(task: str, paradigm: str) -> dict[str, Any]:
    """What the evaluate stage writes: the likelihood, and the answer fields for arith."""
    likelihood = {"task": task, "paradigm": paradigm, "nll_per_token": 0.4, "ppl": 1.5}
    likelihood |= {"n_tokens": 1000, "n_sequences": 10, "likelihood_is_exact": paradigm == "ar"}
    if task != "arith":
        return likelihood
    accuracy = ACCURACY[paradigm]
    return likelihood | {"accuracy": accuracy, "score": accuracy, "n_answers": 500}


def make_run(root: Path, *, vllm: bool = False) -> Path:
    """A finished smoke run's inputs to the summary (smoke preset: tasks arith and text)."""
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(data))
    for paradigm in PARADIGMS:
        _json(root / "metrics/evaluate/arith" / f"{paradigm}.json", evaluate("arith", paradigm))
        _json(root / "metrics/evaluate/text" / f"{paradigm}.json", evaluate("text", paradigm))
    engines = {"transformers:greedy": {"engine_over_own_ar": 0.7, "ci95": [0.6, 0.8]}}
    if vllm:
        engines["vllm:c1"] = VLLM_ENTRY
    tradeoff = {
        "task": "arith",
        "setdlm_vs_ar": {"speedup": 1.84, "ci95": [1.61, 2.1], "setdlm": {"config": "w=4"}},
        "setdlm_vs_bd3lm": {"speedup": 1.1, "ci95": [1.0, 1.2]},
        "points": [{"accuracy": 0.9, "config": "default"}] * 12,
        "ar_engines": engines,
    }
    _json(root / "metrics/tradeoff/arith.json", tradeoff)
    status = {"status": "ran"} if vllm else {"status": "skipped", "reason": "no vLLM " * 12}
    _json(root / "results/baseline/arith.json", {"engines": {"vllm": status}})
    return root


def leaves(data: Any, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Dotted keys of every leaf, as `dvc metrics show` names its columns."""
    if not isinstance(data, dict):
        return {".".join(prefix): data}
    found: dict[str, Any] = {}
    for key, value in data.items():
        found.update(leaves(value, (*prefix, key)))
    return found


def test_summary_records_the_headline_flat_and_prints_it_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_run(tmp_path)
    summary.main(["--write", "--root", str(root), "--params", str(root / "params.yaml")])
    written = capsys.readouterr().out
    record = json.loads((root / "metrics/summary.json").read_text())
    flat = leaves(record)
    assert len(flat) <= 12 and all(isinstance(v, int | float | str) for v in flat.values())
    assert {p: flat[f"arith.accuracy.{p}"] for p in PARADIGMS} == ACCURACY
    assert flat["arith.setdlm_speedup"] == 1.84
    assert (flat["arith.setdlm_speedup_ci_low"], flat["arith.setdlm_speedup_ci_high"]) == (
        1.61,
        2.1,
    )
    assert flat["arith.vllm"] == "skipped"
    lines = written.splitlines()
    assert 3 <= len(lines) <= 10 and max(map(len, lines)) <= 100, written
    assert "1.84x" in written and "1.61" in written and "2.10" in written
    assert "ar 0.930  mdlm 0.610  bd3lm 0.820  aogpt 0.700  setdlm 0.910" in written  # study order
    assert "vLLM" in written and "skipped" in written and "results/baseline/arith.json" in written
    assert "reports/out/report.md" in written
    # `make run`'s last step: print the recorded summary again, nothing recomputed.
    summary.main(["--root", str(root)])
    assert capsys.readouterr().out == written


def test_summary_shows_the_vllm_row_when_vllm_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_run(tmp_path, vllm=True)
    summary.main(["--write", "--root", str(root), "--params", str(root / "params.yaml")])
    flat = leaves(json.loads((root / "metrics/summary.json").read_text()))
    assert flat["arith.vllm_over_ar"] == 1.25 and flat["arith.setdlm_vs_vllm"] == 1.5
    out = capsys.readouterr().out
    assert "vLLM 1.25x our AR (95% CI 1.10-1.40)" in out and "setdlm 1.50x vLLM" in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{}", "setdlm.json: field 'task' missing"),
        (json.dumps(evaluate("arith", "setdlm") | {"accuracy": float("nan")}), "is NaN"),
        (json.dumps(evaluate("arith", "setdlm") | {"accuracy": 1.7}), "1.7 outside [0, 1]"),
        (json.dumps(evaluate("text", "setdlm")), "setdlm.json: field 'accuracy' missing"),
        ('{"accuracy": 0.9', "setdlm.json: not valid JSON"),
    ],
)
def test_a_bad_evaluate_file_is_refused_not_left_out(
    tmp_path: Path, content: str, expected: str
) -> None:
    root = make_run(tmp_path)
    (root / "metrics/evaluate/arith/setdlm.json").write_text(content)
    args = ["--write", "--root", str(root), "--params", str(root / "params.yaml")]
    with pytest.raises(ConfigError, match=re.escape(expected)) as caught:
        summary.main(args)
    assert "metrics/evaluate/arith/setdlm.json" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1
    assert not (root / "metrics/summary.json").exists()  # no summary without setdlm


def test_a_nan_speedup_is_refused(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    path = root / "metrics/tradeoff/arith.json"
    path.write_text(path.read_text().replace('"speedup": 1.84', '"speedup": NaN'))
    args = ["--write", "--root", str(root), "--params", str(root / "params.yaml")]
    with pytest.raises(ConfigError, match=r"tradeoff/arith.json: field 'setdlm_vs_ar.speedup'"):
        summary.main(args)


def test_printing_before_a_run_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metrics/summary.json.*dvc repro"):
        summary.main(["--root", str(tmp_path)])


def test_make_run_ends_with_the_summary_not_a_wide_table() -> None:
    # Under `make test` the parent make's MAKELEVEL would add "make[1]: Leaving directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    last = dry.strip().splitlines()[-1]
    assert last.endswith("setdiff summary") and "metrics show" not in dry
