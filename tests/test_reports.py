"""reports/: loading, statistics, figure content, tables, the built report and comparison mode.

A synthetic run (small but realistic CSV/JSON/JSONL artifacts, written by `write_run`) stands in
for the pipeline, so nothing here trains or decodes. Figures are checked for content: the
plotted data must equal the summary tables, and every paradigm must be in the legend.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure
from metrics_records import AGAINST_BEST_AR, BATCHED, LOSSLESS
from PIL import Image

from reports import analysis, figures, findings, items, study, tables
from reports.build import build, main
from reports.compare import compare, merge, seed_spread_table
from reports.items import ITEMS, Derived, ablation_knobs, derive, make_items
from reports.load import flatten_metrics, load_run
from reports.style import PARADIGM_COLORS, set_theme

REPO = Path(__file__).resolve().parents[1]
PARADIGMS = ("ar", "mdlm", "setdlm")
CONFIGS = {
    "ar": [("default", None, None, 0.80, 1.0)],
    "mdlm": [("threshold=off", None, None, 0.55, 1.0), ("threshold=0.9", None, 0.9, 0.50, 1.8)],
    "setdlm": [
        ("threshold=off window=4", 4, None, 0.75, 1.0),
        ("threshold=0.9 window=4", 4, 0.9, 0.70, 2.2),
        ("threshold=off window=8", 8, None, 0.72, 1.0),
        ("threshold=0.9 window=8", 8, 0.9, 0.60, 3.0),
    ],
}
"""paradigm -> (config, window, threshold, accuracy, tokens per forward)."""
N_EXAMPLES, PROMPT, ANSWER = 20, 10, 12
THROUGHPUT = {"4": 2500.0, "8": 4000.0}
"""vLLM's measured aggregate tokens/s per concurrency (results/baseline/<task>.json)."""


# --- synthetic run ----------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _json(path: Path, data: object) -> None:
    _write(path, json.dumps(data, indent=1))


def _steps(paradigm: str, per_forward: float, rng: np.random.Generator) -> list[list[int]]:
    positions = list(range(PROMPT, PROMPT + ANSWER))
    if paradigm == "ar":
        return [[p] for p in positions]
    if paradigm == "mdlm":
        rng.shuffle(positions)
    steps = []
    while positions:
        k = max(1, min(len(positions), int(rng.poisson(per_forward - 1)) + 1))
        head = positions[: min(len(positions), 4)]
        chosen = sorted(rng.choice(head, size=min(k, len(head)), replace=False).tolist())
        steps.append(chosen)
        positions = [p for p in positions if p not in chosen]
    return steps


def _bench(task: str, rng: np.random.Generator, speed: float) -> tuple[list[dict], list[dict]]:
    rows, traces = [], []
    for paradigm in PARADIGMS:
        for config, window, threshold, accuracy, per_forward in CONFIGS[paradigm]:
            for example in range(N_EXAMPLES):
                steps = _steps(paradigm, per_forward, rng)
                latency = speed * len(steps) * 0.002 * (1 + 0.1 * rng.random())
                rows.append(
                    {
                        "task": task,
                        "paradigm": paradigm,
                        "engine": "setdiff",
                        "config": config,
                        "window": window,
                        "threshold": threshold,
                        "regime": "latency",
                        "concurrency": 1,
                        "example": example,
                        "prompt_tokens": PROMPT,
                        "new_tokens": ANSWER,
                        "nfe": len(steps),
                        "latency_s": latency,
                        "forward_s": latency * 0.9,
                        "peak_mem_mb": 300 + 10 * per_forward,
                        "kv_cache_mb": 0.02,
                        "score": float(rng.random() < accuracy),
                        "exact": float(rng.random() < accuracy),
                        "stopped": True,
                        "tokens_per_forward": ANSWER / len(steps),
                        "tokens_per_second": ANSWER / latency,
                    }
                )
                traces.append(
                    {
                        "paradigm": paradigm,
                        "config": config,
                        "example": example,
                        "prompt_tokens": PROMPT,
                        "steps": steps,
                    }
                )
    return rows, traces


def _baseline(task: str, rng: np.random.Generator) -> list[dict]:
    rows = []
    for engine, regime, concurrency, latency in [
        ("setdiff", "latency", 1, 0.02),
        ("vllm", "latency", 1, 0.004),
        ("transformers", "latency", 1, 0.03),
        ("vllm", "throughput", 4, 0.01),
        ("vllm", "throughput", 8, 0.02),
    ]:
        config = "greedy" if regime == "latency" else f"greedy concurrency={concurrency}"
        for example in range(N_EXAMPLES):
            rows.append(
                {
                    "task": task,
                    "paradigm": "ar",
                    "engine": engine,
                    "config": config,
                    "window": None,
                    "threshold": None,
                    "regime": regime,
                    "concurrency": concurrency,
                    "example": example,
                    "prompt_tokens": PROMPT,
                    "new_tokens": ANSWER,
                    "nfe": ANSWER,
                    "latency_s": latency,
                    "forward_s": None,
                    "peak_mem_mb": 900.0,
                    "kv_cache_mb": None,
                    "score": 1.0,
                    "exact": float(rng.random() < 0.8),
                    "stopped": True,
                    "tokens_per_forward": 1.0,
                    "tokens_per_second": ANSWER / latency,
                }
            )
    return rows


def _point(config: str, accuracy: float, rate: float) -> dict:
    return {
        "config": config,
        "engine": "setdiff",
        "accuracy": accuracy,
        "tokens_per_second": rate,
        "tokens_per_forward": 1.5,
        "latency_s": 0.01,
        "nfe": 8.0,
        "n": N_EXAMPLES,
    }


def _tradeoff() -> dict:
    return {
        "setdlm_vs_ar": {
            "speedup": 1.8,
            "ci95": [1.5, 2.1],
            "max_drop": 0.02,
            "reference": _point("threshold=off window=4", 0.75, 900.0),
            "setdlm": _point("threshold=0.9 window=8", 0.74, 1800.0),
            "ar": _point("default", 0.8, 1000.0),
            "forward_cost_ratio": 1.1,
            "selected_on": {"split": "validation", "n": 200},
            "test_drop": {"estimate": 0.01, "ci95": [-0.02, 0.04]},
            "anchor": "ar",
            "accuracy_diff": {"estimate": -0.06, "ci95": [-0.09, -0.03]},
            "lossy": [
                {
                    "setdlm": _point("threshold=0.7 window=8", 0.7, 2500.0),
                    "speedup": 2.5,
                    "ci95": [2.2, 2.8],
                    "accuracy_diff": {"estimate": -0.1, "ci95": [-0.14, -0.06]},
                }
            ],
        },
        "setdlm_vs_bd3lm": {"missing": "no bd3lm rows"},
        "aogpt_vs_mdlm": {"missing": "no aogpt rows"},
        "points": [],
        "ar_engines": {
            "vllm:greedy": {
                "engine_over_own_ar": 3.0,
                "ci95": [2.5, 3.5],
                "engine": _point("greedy", 0.8, 3000.0) | {"engine": "vllm"},
                "own_ar": _point("greedy", 0.8, 1e3),
                "setdlm_vs_vllm": 0.6,
            }
        },
    }


def _models(root: Path, task: str, paradigm: str, rng: np.random.Generator) -> None:
    exact = paradigm == "ar"
    ppl = float(6 + 4 * rng.random())
    _json(
        root / f"metrics/evaluate/{task}/{paradigm}.json",
        {
            "task": task,
            "paradigm": paradigm,
            "nll_per_token": float(np.log(ppl)),
            "ppl": ppl,
            "likelihood_is_exact": exact,
            "n_tokens": 1000,
            "n_sequences": 64,
        },
    )
    _json(
        root / f"metrics/train/{task}/{paradigm}.json",
        {
            "steps": 40,
            "final_train_loss": 1.9,
            "final_eval_loss": 2.0,
            "seconds": 3.0,
            "resumed_from": 0,
            "parameters": 84800,
            "run_id": "abc",
        },
    )
    log = [
        {
            "step": s,
            "train_loss": 3 - s / 30 + rng.random() / 10,
            "eval_loss": 3.1 - s / 30,
            "lr": 1e-3,
            "seconds": s / 10,
        }
        for s in (10, 20, 30, 40)
    ]
    _write(
        root / f"models/{task}/{paradigm}/train_log.jsonl",
        "\n".join(json.dumps(r) for r in log) + "\n",
    )


def _textgen(root: Path, paradigm: str, rng: np.random.Generator) -> None:
    rows = [
        {
            "task": "text",
            "paradigm": paradigm,
            "engine": "setdiff",
            "config": kind,
            "window": None,
            "threshold": None,
            "regime": "latency",
            "concurrency": 1,
            "example": i,
            "prompt_tokens": 30,
            "new_tokens": 20,
            "nfe": 10,
            "latency_s": 0.05,
            "forward_s": 0.04,
            "peak_mem_mb": 310.0,
            "kv_cache_mb": 0.1,
            "score": float(rng.random()),
            "exact": float("nan"),
            "stopped": True,
            "tokens_per_forward": 2.0,
            "tokens_per_second": 400.0,
        }
        for kind in ("infill", "uncond")
        for i in range(10)
    ]
    _write(root / f"results/textgen/text/{paradigm}.csv", pd.DataFrame(rows).to_csv(index=False))
    _json(
        root / f"metrics/textgen/text/{paradigm}.json",
        {
            "task": "text",
            "paradigm": paradigm,
            "infill_rouge_l": float(np.mean([r["score"] for r in rows if r["config"] == "infill"])),
            "infill_exact": 0.1,
            "uncond_gen_ppl": 80.0,
            "uncond_unigram_entropy": 4.2,
            "uncond_distinct_1": 0.5,
            "uncond_distinct_2": 0.8,
            "uncond_distinct_3": 0.9,
            "my_new_metric": 42.0,
            "decode_options": {"window": 4},
            "fingerprint": {"threads": 1},
        },
    )


def _trials(rng: np.random.Generator) -> pd.DataFrame:
    records = []
    for number in range(24):
        set_size, window = int(rng.choice([2, 4, 8])), int(rng.choice([4, 8]))
        state = "COMPLETE" if number % 6 else "PRUNED"
        accuracy = 0.9 - 0.04 * set_size + rng.random() / 20
        rate = 100.0 * set_size + 5 * window + rng.random()
        records.append(
            {
                "number": number,
                "state": state,
                "accuracy": accuracy,
                "tokens_per_second": rate,
                "nfe_mean": 12.0 / set_size,
                "param_set_size": set_size,
                "param_window": window,
                "param_threshold": 0.9,
            }
        )
    frame = pd.DataFrame(records)
    done = frame["state"] == "COMPLETE"
    frame["is_pareto"] = False
    frame.loc[done, "is_pareto"] = analysis.pareto_mask(frame[done], "tokens_per_second")
    return frame


BACKBONE = {
    "task": "arith",
    "n_examples": 100,
    "rows": [
        {"variant": "base", "parameters": 1000, "model": {"n_head": 2}, "ar": 0.9,
         "setdlm_d2": 0.7, "setdlm_d2_w1": 0.75, "setdlm_d2_eval_loss": 0.3},
        {"variant": "4-heads", "parameters": 1000, "model": {"n_head": 4}, "ar": 0.96,
         "setdlm_d2": 0.95, "setdlm_d2_w1": 0.94, "setdlm_d2_eval_loss": 0.2},
        {"variant": "later", "missing": "not run yet (setdiff backbone computes it)"},
    ],
}  # fmt: skip


SEEDS = {
    "task": "arith",
    "n_examples": 200,
    "steps": None,
    "paradigms": {
        "setdlm": {
            "seeds": [1, 2],
            "accuracies": [0.7, 0.66],
            "n": 2,
            "mean": 0.68,
            "sd": 0.0283,
            "binomial_se": 0.033,
            "steps": 300,
            "recipe_seed": 0,
            "recipe_steps": 300,
        }
    },
}
SETSIZE = {
    "task": "arith",
    "n_examples": 200,
    "main": {"setdlm": {"set_size": 4, "window": 4}},
    "rows": [
        {"paradigm": "setdlm", "set_size": 2, "window": 2, "accuracy": 0.93, "n_examples": 200,
         "steps": 300, "seed": 0},
    ],
}  # fmt: skip
LMEVAL = {
    "task": "arith",
    "n_examples": 20,
    "engines": {
        name: {"status": "ran", "lmeval_accuracy": acc, "setdiff_accuracy": acc, "n": 20,
               "same_text": 20, "same_verdict": 20, "disagreements": []}
        for name, acc in (("ar", 0.95), ("setdlm", 0.8), ("vllm", 0.95))
    },
}  # fmt: skip


def write_run(root: Path, seed: int = 0, speed: float = 1.0, preset: str = "test") -> Path:
    """A complete synthetic run: bench (+ traces, baseline), tradeoff, evaluate, train, textgen,
    ablation trials, params.yaml and dvc.lock."""
    rng = np.random.default_rng(seed)
    params = {
        "preset": preset,
        "study": {"tasks": ["arith", "text"], "paradigms": list(PARADIGMS)},
        "bench": {"tasks": ["arith"], "sweep": {p: {} for p in PARADIGMS}},
        "data": {"seed": 0, "arith": {"n_train": 2000, "n_valid": 100, "n_test": 100}},
        "train": {"arith": {"ar": {"steps": 40, "threads": 2}, "diffusion": {"steps": 20}}},
    }
    _write(root / "params.yaml", yaml.safe_dump(params))
    rows, traces = _bench("arith", rng, speed)
    _write(root / "results/bench/arith.csv", pd.DataFrame(rows).to_csv(index=False))
    # the validation rows the tradeoff chooses on (bench.run.n_select): a sidecar, not a task
    _write(root / "results/bench/arith.select.csv", pd.DataFrame(rows[:10]).to_csv(index=False))
    _write(root / "results/bench/arith.traces.jsonl", "\n".join(map(json.dumps, traces)) + "\n")
    configs = [
        {"paradigm": p, "config": c[0], "options": {}} for p in PARADIGMS for c in CONFIGS[p]
    ]
    fingerprint = {
        "device": "cpu",
        "device_name": "x86_64",
        "threads": 1,
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "platform": "Linux",
        "git_revision": f"rev{seed}",
        "params_hash": f"hash{seed}",
        "checkpoint_sha256": {"ar": "00ff"},
    }
    _json(
        root / "results/bench/arith.json",
        {
            "task": "arith",
            "configurations": configs,
            "run": {"n_examples": N_EXAMPLES},
            "fingerprint": fingerprint,
        },
    )
    _write(root / "results/baseline/arith.csv", pd.DataFrame(_baseline("arith", rng)).to_csv())
    engines = {
        "setdiff": {"status": "ran"},
        "transformers": {"status": "ran"},
        "vllm": {"status": "ran", "base_url": "http://127.0.0.1:8000/v1", "throughput": THROUGHPUT},
    }
    _json(root / "results/baseline/arith.json", {"task": "arith", "engines": engines})
    _json(root / "metrics/tradeoff/arith.json", _tradeoff())
    for task in ("arith", "text"):
        for paradigm in PARADIGMS:
            _models(root, task, paradigm, rng)
    for paradigm in PARADIGMS:
        _textgen(root, paradigm, rng)
    _write(root / "ablations/arith/trials.csv", _trials(rng).to_csv(index=False))
    _json(root / "metrics/backbone/arith.json", BACKBONE)
    _json(root / "metrics/seeds/arith.json", SEEDS)
    _json(root / "metrics/setsize/arith.json", SETSIZE)
    _json(root / "metrics/lossless/arith.json", LOSSLESS)
    _json(root / "metrics/lmeval/arith/summary.json", LMEVAL)
    _json(
        root / "results/throughput/arith.json",
        {"task": "arith", "figures": BATCHED, "against_best_ar": AGAINST_BEST_AR},
    )
    lock = {
        "schema": "2.0",
        "stages": {
            "bench@arith": {
                "cmd": "setdiff bench --task arith",
                "deps": [{"path": "models/arith", "hash": "md5", "md5": "aa11.dir"}],
                "outs": [{"path": "results/bench/arith.csv", "hash": "md5", "md5": "bb22"}],
            }
        },
    }
    _write(root / "dvc.lock", yaml.safe_dump(lock))
    return root


def test_batched_table_says_where_set_decoding_stops_beating_ar(derived: Derived) -> None:
    table = tables.batched_table(derived.run.batched).set_index("method")
    row = table.loc["setdlm threshold=0.9 window=4"]
    # each ratio is to the fastest AR engine at that batch size: ours at B = 1, transformers' after
    assert row["B=1"] == "200 (2.00×)" and row["B=4"] == "450 (0.90×)"
    assert row["B=16"] == "540 (0.60×)" and row["rows = batch 1"] == "yes"
    assert row["crossover (best AR)"] == "B=4"
    assert row["crossover per AR engine"] == "ar B=16; ar · transformers B=4"
    assert table.loc["ar · transformers", "crossover (best AR)"] == ""


def test_dvc_lock_is_one_hash_per_stage_and_one_for_all_folded(
    derived: Derived, built: Path
) -> None:
    """The lock is collapsed (a row per stage, `all` first) and rendered closed in both files;
    a changed md5 changes its stage's hash and the overall one, not another stage's."""
    lock = derived.run.lock
    table = tables.lock_table(lock).set_index("stage")
    assert list(table.index) == ["all", "bench@arith"]
    assert table.loc["bench@arith", "deps"] == "1" and table.loc["bench@arith", "outs"] == "1"
    other = pd.DataFrame([{"stage": "x", "kind": "dep", "path": "p", "md5": "1"}])
    before = tables.lock_table(pd.concat([lock, other])).set_index("stage")["sha256"]
    other.loc[0, "md5"] = "2"
    after = tables.lock_table(pd.concat([lock, other])).set_index("stage")["sha256"]
    assert after["bench@arith"] == before["bench@arith"]
    assert after["x"] != before["x"] and after["all"] != before["all"]
    for name in ("report.md", "report.html"):
        text = (built / name).read_text()
        assert "<details><summary>One hash per stage" in text
        assert "aa11.dir" not in text  # no per-file md5 in the report


def test_lossless_table_shows_every_method_against_ar_and_the_best_speculative(
    derived: Derived,
) -> None:
    table = tables.lossless_table(derived.run.lossless).set_index("method")
    assert list(table.index) == ["ar", "ar+draft k=2", "setdlm W=1", "setdlm verify W=8"]
    verify = table.loc["setdlm verify W=8"]
    assert verify["tokens/s"] == "1,240" and verify["tokens/forward"] == "2.97"
    assert verify["drafts accepted"] == "63%"
    assert verify["identical to its reference"] == "setdlm W=1: 60/60"
    assert verify["× AR [95% CI]"] == "2.06 [1.99, 2.13]"
    assert verify["× fastest AR + speculative [95% CI]"] == "1.69 [1.64, 1.74] vs ar+draft k=2"
    assert table.loc["ar", "identical to its reference"] == ""


def test_batched_table_falls_back_to_our_ar_without_the_engine_comparison() -> None:
    frame = pd.DataFrame(
        [{"task": "arith", **r} for r in BATCHED if "transformers" not in r["method"]]
    )
    row = tables.batched_table(frame).set_index("method").loc["setdlm threshold=0.9 window=4"]
    assert row["B=16"] == "540 (0.90×)" and row["beats batched AR up to"] == "B=4"


def test_rates_have_three_significant_figures() -> None:
    assert [tables.fmt_rate(v) for v in (8413.2, 1104.0, 96.34, 0.5)] == [
        "8,410",
        "1,100",
        "96.3",
        "0.5",
    ]


@pytest.fixture(scope="module", autouse=True)
def theme() -> None:
    set_theme()


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def derived(run_root: Path) -> Derived:
    return derive(load_run(run_root))


@pytest.fixture(scope="module")
def built(run_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out")
    main(["--root", str(run_root), "--out", str(out)])
    return out


# --- layering ---------------------------------------------------------------------------------


def test_reports_never_import_torch_or_setdiff() -> None:
    for path in sorted((REPO / "reports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [n for n in names if n.split(".")[0] in ("torch", "setdiff")]
            assert not bad, f"{path.name} imports {bad}"
    code = (
        "import sys, reports.build, reports.compare; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'setdiff')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_dvc_report_stage_reads_every_report_module() -> None:
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].get("report")
    if stage is None:
        pytest.skip("dvc.yaml has no report stage yet")
    modules = {f"reports/{p.name}" for p in (REPO / "reports").glob("*.py")} - {
        "reports/compare.py"  # not run by the stage
    }
    assert stage["cmd"] == "python -m reports.build"
    assert modules <= set(stage["deps"]), sorted(modules - set(stage["deps"]))
    assert stage["outs"] == ["reports/out"]


# --- load -------------------------------------------------------------------------------------


def test_complete_run_has_nothing_missing(derived: Derived) -> None:
    run = derived.run
    # Only the sections the tradeoff file itself marks as missing are reported.
    assert [m.path for m in run.missing] == [
        "metrics/tradeoff/arith.json#setdlm_vs_bd3lm",
        "metrics/tradeoff/arith.json#aogpt_vs_mdlm",
    ]
    assert run.preset == "test"
    assert len(run.rows) == N_EXAMPLES * (sum(len(c) for c in CONFIGS.values()) + 5)
    assert set(run.engines["status"]) == {"ran"}
    assert set(run.evaluate["paradigm"]) == set(PARADIGMS)
    assert list(run.lock["md5"]) == ["aa11.dir", "bb22"]
    assert run.trials["is_pareto"].dtype == bool


def test_lmeval_table_shows_both_scorers_and_agreement(derived: Derived) -> None:
    table = tables.lmeval_table(derived.run.lmeval).set_index("engine")
    assert table.loc["setdlm · setdiff", "lm-eval accuracy"] == "0.800"
    assert table.loc["setdlm · setdiff", "setdiff accuracy"] == "0.800"
    assert table.loc["ar · vLLM (local-completions)", "same text"] == "20/20"


def test_backbone_table_shows_accuracy_with_error_and_gap(derived: Derived) -> None:
    table = tables.backbone_table(derived.run.backbone)
    assert list(table["variant"]) == ["base", "4-heads", "later"]
    # every accuracy with its 95% Wilson interval (100 prompts), as everywhere in the report
    assert list(table["ar"]) == ["0.900 [0.826, 0.945]", "0.960 [0.902, 0.984]", "not run yet"]
    assert list(table["setdlm D=2 W=2"]) == [
        "0.700 [0.604, 0.781]",
        "0.950 [0.888, 0.978]",
        "not run yet",
    ]
    assert list(table["gap d2 (pts)"]) == ["-20.0", "-1.0", ""]
    assert "setdlm D=2 W=1" in table and "setdlm_d2_eval_loss" not in table


def test_tradeoff_is_flattened_with_engines(derived: Derived) -> None:
    table = derived.run.comparisons.set_index("comparison")
    assert table.loc["setdlm vs ar", "speedup"] == 1.8
    assert table.loc["setdlm vs ar", "method_config"] == "threshold=0.9 window=8"
    assert table.loc["setdlm vs ar", "matched"] == (
        "within 0.02 of ar's accuracy; chosen on 200 validation prompts; "
        "on test -0.060 [-0.090, -0.030] against ar"
    )
    assert table.loc["ar · vllm:greedy vs ar · setdiff", "speedup"] == 3.0
    assert table.loc["ar · vllm:greedy vs ar · setdiff", "method_engine"] == "vllm"
    assert table.loc["setdlm vs ar · vllm:greedy", "speedup"] == 0.6
    assert table.loc["setdlm vs ar · vllm:greedy", "method_config"] == "threshold=0.9 window=8"
    assert list(table.index[:4]) == [
        "setdlm vs ar",
        "setdlm vs ar (lossy)",
        "setdlm vs ar · vllm:greedy",
        "ar · vllm:greedy vs ar · setdiff",
    ]
    assert table.loc["setdlm vs bd3lm", "missing"] == "no bd3lm rows"


# --- analysis ---------------------------------------------------------------------------------


def test_summary_follows_the_pipeline_rule(derived: Derived) -> None:
    rows, points = derived.run.rows, derived.points
    for point in points.itertuples():
        group = rows[
            (rows["source"] == point.source)
            & (rows["paradigm"] == point.paradigm)
            & (rows["engine"] == point.engine)
            & (rows["config"] == point.config)
        ]
        assert point.n == len(group) == N_EXAMPLES
        assert point.accuracy == pytest.approx(group["exact"].mean())
        rate = group["new_tokens"].sum() / group["latency_s"].sum()
        if point.regime == "throughput":  # the measured aggregate replaces the estimate
            rate = THROUGHPUT[str(point.concurrency)]
        assert point.tokens_per_second == pytest.approx(rate)
        assert point.tokens_per_forward == pytest.approx(
            group["new_tokens"].sum() / group["nfe"].sum()
        )
        assert point.accuracy_lo <= point.accuracy <= point.accuracy_hi
    series = {"ar", "mdlm", "setdlm", "ar · setdiff", "ar · vllm", "ar · transformers"}
    assert set(points["series"]) == series | {"ar · vllm (throughput)"}
    fallback = analysis.summarize_configs(rows)  # no aggregate reported: concurrency x rate
    vllm = fallback[fallback["config"] == "greedy concurrency=8"].iloc[0]
    group = rows[rows["config"] == "greedy concurrency=8"]
    expected = 8 * group["new_tokens"].sum() / group["latency_s"].sum()
    assert vllm["tokens_per_second"] == pytest.approx(expected)


def test_bootstrap_ci_edge_cases() -> None:
    assert np.isnan(analysis.bootstrap_mean_ci(np.array([]))[0])
    assert analysis.bootstrap_mean_ci(np.ones(5)) == (1.0, 1.0)
    low, high = analysis.bootstrap_mean_ci(np.r_[np.zeros(50), np.ones(50)])
    assert 0.35 < low < 0.5 < high < 0.65


def test_continuous_knobs_are_binned_for_heatmaps() -> None:
    rng = np.random.default_rng(0)
    trials = pd.DataFrame(
        {
            "task": "arith",
            "state": "COMPLETE",
            "param_threshold": rng.uniform(0.5, 1.0, 40),
            "param_window": rng.choice([4, 8], 40),
            "accuracy": rng.random(40),
            "tokens_per_second": rng.random(40),
        }
    )
    binned = analysis.bin_knobs(trials)
    assert binned["param_window"].equals(trials["param_window"])
    assert binned["param_threshold"].nunique() == 5
    assert ablation_knobs(binned) == ("param_window", "param_threshold")
    fig = figures.plot_ablation_heatmaps(binned, "param_window", "param_threshold")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == sorted(labels, key=lambda t: float(t.split("–")[0]))


def test_pareto_mask() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0, 2.5, 3.0], "accuracy": [0.9, 0.8, 0.5, 0.4, 0.5]})
    assert list(analysis.pareto_mask(frame, "x")) == [True, True, True, False, False]
    assert list(analysis.pareto_mask(frame, "x", larger_x=False)) == [
        True,
        False,
        False,
        False,
        False,
    ]


def _tau_brute(x: list[float], y: list[float]) -> float:
    pairs = [(i, j) for i in range(len(x)) for j in range(i + 1, len(x))]
    s = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs)
    tx = sum(x[i] != x[j] for i, j in pairs)
    ty = sum(y[i] != y[j] for i, j in pairs)
    return s / np.sqrt(tx * ty)


def test_kendall_tau_and_frontier_distance() -> None:
    assert analysis.order_metrics([[10], [11], [12]])["kendall_tau"] == 1.0
    assert analysis.order_metrics([[12], [11], [10]])["kendall_tau"] == -1.0
    assert np.isnan(analysis.order_metrics([[10, 11, 12]])["kendall_tau"])
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, 15).tolist(), rng.integers(0, 4, 15).tolist()
    assert analysis.kendall_tau_b(np.array(x), np.array(y)) == pytest.approx(_tau_brute(x, y))
    # frontier 10 -> decodes 12 (distance 2) and 10 (0); frontier 11 -> 13 (2), 11 (0)
    metrics = analysis.order_metrics([[10, 12], [11, 13]])
    assert metrics["frontier_distance"] == 1.0
    assert metrics["max_frontier_distance"] == 2.0
    assert analysis.order_metrics([[10], [11]])["frontier_distance"] == 0.0


# --- figures: content, not only existence -----------------------------------------------------


def _by_gid(artists: list, prefix: str) -> dict[str, object]:
    return {
        a.get_gid()[len(prefix) :]: a for a in artists if (a.get_gid() or "").startswith(prefix)
    }


def _legend(ax: object) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("x", ["tokens_per_second", "tokens_per_forward", "latency_s"])
def test_quality_figures_plot_the_summary(derived: Derived, x: str) -> None:
    make = {
        "tokens_per_second": figures.plot_quality_vs_throughput,
        "tokens_per_forward": figures.plot_quality_vs_tokens_per_forward,
        "latency_s": figures.plot_quality_vs_latency,
    }[x]
    points = derived.points
    ax = make(points).axes[0]
    dots, fronts = _by_gid(ax.lines, "points:arith:"), _by_gid(ax.lines, "frontier:arith:")
    bars = _by_gid(ax.collections, "ci:arith:")
    # The baseline stage's "ar · setdiff" is the bench's "ar" again: plotted once.
    assert set(dots) == set(fronts) == set(bars) == set(points["series"]) - {"ar · setdiff"}
    plotted = points[points["series"] != "ar · setdiff"]
    for series, group in plotted.groupby("series"):
        group = group.sort_values(x)
        np.testing.assert_allclose(dots[series].get_xdata(), group[x])
        np.testing.assert_allclose(dots[series].get_ydata(), group["accuracy"])
        segments = bars[series].get_segments()  # one vertical CI bar per configuration
        np.testing.assert_allclose([s[:, 1].min() for s in segments], group["accuracy_lo"])
        np.testing.assert_allclose([s[:, 1].max() for s in segments], group["accuracy_hi"])
        front = group[analysis.pareto_mask(group, x, larger_x=x != "latency_s")]
        np.testing.assert_allclose(fronts[series].get_xdata(), front[x])
        np.testing.assert_allclose(fronts[series].get_ydata(), front["accuracy"])
    legend = _legend(ax)
    assert set(PARADIGMS) <= set(legend)
    assert {"ar · vllm", "ar · transformers", "ar · vllm (throughput)"} <= set(legend)
    # Only the task's overall Pareto front is labelled (series of one point carry no label).
    front = plotted[analysis.pareto_mask(plotted, x, larger_x=x != "latency_s")]
    sizes = plotted["series"].map(plotted["series"].value_counts())
    front = front[sizes.loc[front.index] > 1]
    expected = sorted(figures._short_config(c) for c in front["config"])
    assert sorted(t.get_text() for t in ax.texts) == expected
    assert not any("threshold=" in t.get_text() for t in ax.texts)


def test_lossless_methods_are_drawn_on_the_tokens_per_forward_figure(derived: Derived) -> None:
    lossless = derived.run.lossless
    ax = figures.plot_quality_vs_tokens_per_forward(derived.points, lossless).axes[0]
    drawn = _by_gid(ax.lines, "lossless:arith:")
    # The speculative ones; the plain decodes (1 token per forward) are the bench's points.
    assert set(drawn) == {"ar+draft k=2", "setdlm verify W=8"}
    verify = lossless[lossless["method"] == "setdlm verify W=8"].iloc[0]
    assert drawn["setdlm verify W=8"].get_xdata()[0] == pytest.approx(verify["tokens_per_forward"])
    assert drawn["setdlm verify W=8"].get_ydata()[0] == pytest.approx(verify["accuracy"])
    assert drawn["setdlm verify W=8"].get_color() == PARADIGM_COLORS["setdlm"]
    assert {"ar+draft k=2 (lossless)", "setdlm verify W=8 (lossless)"} <= set(_legend(ax))
    plain = figures.plot_quality_vs_tokens_per_forward(derived.points).axes[0]
    assert not _by_gid(plain.lines, "lossless:")


def test_labels_that_would_overprint_are_hidden_in_drawing_order() -> None:
    ax = Figure(figsize=(4, 3), layout="constrained").subplots()
    ax.set(xlim=(0, 10), ylim=(0, 1))
    first = ax.annotate("threshold 0.9", (5.0, 0.5), fontsize=7)
    close = ax.annotate("threshold 0.8", (5.1, 0.51), fontsize=7)  # overprints the first
    far = ax.annotate("W8", (1.0, 0.1), fontsize=7)
    assert figures.hide_overprinted_labels(ax) == ["threshold 0.8"]
    assert first.get_visible() and far.get_visible() and not close.get_visible()
    assert figures._short_config("verify=True window=8") == "verify W8"


def test_accuracy_under_parallelism_follows_d3llm() -> None:
    aup = analysis.accuracy_under_parallelism
    assert aup([1.0], [94.0], 94.0) == pytest.approx(94.0)  # plain AR: its accuracy
    assert aup([2.0], [90.0], 94.0) == pytest.approx(180.0)  # one point: rho * y
    # Trapezoids of y * W(y), W(y) = min(exp(-3 (1 - y / y_max)), 1); a point more than 5
    # points below the first is left out, whatever its parallelism.
    weight = np.exp(-3 * (1 - 90 / 94))
    expected = 1 * 94 + 0.5 * (3 - 1) * (94 + 90 * weight)
    assert aup([3.0, 1.0, 9.0], [90.0, 94.0, 80.0], 94.0) == pytest.approx(expected)
    assert np.isnan(aup([], [], 94.0))


def test_aup_table_ranks_paradigm_fronts_and_lossless_methods(derived: Derived) -> None:
    table = tables.aup_table(derived.points, derived.run.lossless)
    arith = table[table["task"] == "arith"].set_index("method")
    assert {
        "ar",
        "mdlm",
        "setdlm",
        "ar+draft k=2 (lossless)",
        "setdlm verify W=8 (lossless)",
    } <= set(arith.index)
    assert list(arith["AUP"].astype(float)) == sorted(arith["AUP"].astype(float), reverse=True)
    # A single lossless point: rho * y, in points.
    assert float(arith.loc["setdlm verify W=8 (lossless)", "AUP"]) == pytest.approx(
        2.97 * 94.0, abs=0.05
    )
    assert tables.aup_table(pd.DataFrame(), pd.DataFrame()).empty


def test_paradigm_colours_are_fixed(derived: Derived) -> None:
    ax = figures.plot_quality_vs_throughput(derived.points).axes[0]
    dots = _by_gid(ax.lines, "points:arith:")
    for paradigm in PARADIGMS:
        assert dots[paradigm].get_color() == PARADIGM_COLORS[paradigm]
    assert dots["ar · vllm"].get_color() != PARADIGM_COLORS["ar"]


def test_ablation_heatmap_cells_are_trial_means(derived: Derived) -> None:
    trials = derived.run.trials
    fig = figures.plot_ablation_heatmaps(trials, "param_set_size", "param_window")
    done = trials[trials["state"] == "COMPLETE"]
    meshes = _by_gid([c for ax in fig.axes for c in ax.collections], "heatmap:arith:")
    for value in ("accuracy", "tokens_per_second"):
        mesh = meshes[value]
        expected = done.pivot_table(index="param_window", columns="param_set_size", values=value)
        np.testing.assert_allclose(
            np.asarray(mesh.get_array()).ravel(), expected.to_numpy().ravel()
        )


def test_optuna_pareto_highlights_pareto_trials(derived: Derived) -> None:
    trials = derived.run.trials
    ax = figures.plot_optuna_pareto(trials).axes[0]
    best = _by_gid(ax.collections, "pareto:arith:")["setdlm"].get_offsets()
    expected = trials[trials["is_pareto"]][["tokens_per_second", "accuracy"]]
    assert sorted(map(tuple, best)) == sorted(map(tuple, expected.to_numpy()))
    rest = _by_gid(ax.collections, "trials:")["arith"].get_offsets()
    assert len(rest) == (trials["state"] == "COMPLETE").sum() - len(expected)
    assert "4 pruned" in ax.get_title()


def _study_export() -> dict:
    trials = []
    for number in range(8):
        set_size, window = (2, 4, 8)[number % 3], (4, 8)[number % 2]
        metrics = {
            "accuracy": 0.9 - 0.05 * set_size,
            "nfe_mean": 12 / set_size,
            "tokens_per_second": 100.0 * set_size,
            "tokens_per_forward": float(set_size),
        }
        trials.append(
            {
                "number": number,
                "state": "COMPLETE" if number != 7 else "FAIL",
                "params": {"set_size": set_size, "window": window, "exponent": None},
                "values": {"accuracy": metrics["accuracy"], "nfe_mean": metrics["nfe_mean"]},
                "pareto": number in (0, 1, 2),
                "paradigm": "setdlm",
                "metrics": metrics,
            }
        )
    return {
        "study": "arith-smoke-abc",
        "task": "arith",
        "pareto": [0, 1, 2],
        "trials": trials,
        "objectives": [
            {"name": "accuracy", "direction": "maximize"},
            {"name": "nfe_mean", "direction": "minimize"},
        ],
    }


def test_optuna_study_export_is_read(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    (root / "ablations/arith/trials.csv").unlink()
    _json(root / "ablations/arith/arith-smoke-abc/study.json", _study_export())
    run = load_run(root)
    assert not [m for m in run.missing if m.kind == "trials"]
    trials = run.trials
    assert len(trials) == 8 and set(trials["study"]) == {"arith-smoke-abc"}
    assert list(trials["param_exponent"].unique()) == ["default"]
    assert study.front_axis(trials) == "nfe_mean"
    ax = figures.plot_optuna_pareto(trials, "nfe_mean").axes[0]
    best = _by_gid(ax.collections, "pareto:arith:arith-smoke-abc:")["setdlm"].get_offsets()
    assert sorted(best[:, 0]) == sorted(trials.loc[trials["is_pareto"], "nfe_mean"])
    assert "7 complete, 1 fail" in ax.get_title()
    (root / "ablations/arith/arith-smoke-abc/study.json").write_text("{")
    problems = {m.path: m.problem for m in load_run(root).missing if m.kind == "trials"}
    assert problems["ablations/arith/arith-smoke-abc/study.json"].startswith("unreadable")


def test_set_size_histogram_matches_traces(derived: Derived) -> None:
    sizes = derived.sizes
    fig = figures.plot_set_size_histogram(sizes)
    assert [ax.get_title() for ax in fig.axes] == [f"arith · {p}" for p in PARADIGMS]
    patches = [p for ax in fig.axes for p in ax.patches]
    for (paradigm, config), group in sizes.groupby(["paradigm", "config"]):
        bars = [p for p in patches if p.get_gid() == f"hist:arith:{paradigm}:{config}"]
        share = group["set_size"].value_counts(normalize=True).sort_index()
        np.testing.assert_allclose([b.get_height() for b in bars], share.to_numpy())
        centres = [b.get_x() + b.get_width() / 2 for b in bars]
        np.testing.assert_allclose(np.round(centres), share.index)  # dodge offsets < 0.5


@pytest.mark.parametrize("value", ["kendall_tau", "frontier_distance"])
def test_decode_order_dots_are_per_example_values(derived: Derived, value: str) -> None:
    orders = derived.orders
    make = figures.plot_kendall_tau if value == "kendall_tau" else figures.plot_frontier_distance
    ax = make(orders).axes[0]
    dots = _by_gid(ax.collections, f"{value}:arith:")
    assert len(dots) == orders.groupby(["paradigm", "config"]).ngroups
    for (paradigm, config), group in orders.groupby(["paradigm", "config"]):
        xs = dots[f"{paradigm}:{config}"].get_offsets()[:, 0]
        np.testing.assert_allclose(np.sort(xs), np.sort(group[value].dropna()))
    assert set(_legend(ax)) == set(PARADIGMS)
    if value == "kendall_tau":
        np.testing.assert_allclose(dots["ar:default"].get_offsets()[:, 0], 1.0)


def test_training_curves_match_logs(derived: Derived) -> None:
    log = derived.run.train_log
    fig = figures.plot_training_curves(log)
    assert len(fig.axes) == 4  # 2 tasks x (train, eval)
    lines = _by_gid([line for ax in fig.axes for line in ax.lines], "")
    for (task, paradigm), group in log.groupby(["task", "paradigm"]):
        for metric in ("train_loss", "eval_loss"):
            line = lines[f"{metric}:{task}:{paradigm}"]
            np.testing.assert_allclose(line.get_ydata(), group.sort_values("step")[metric])
    for ax in fig.axes:
        assert _legend(ax) == list(PARADIGMS)


def test_a_logged_accuracy_gets_its_own_column(derived: Derived) -> None:
    log = derived.run.train_log.copy()
    arith = log["task"] == "arith"
    log.loc[arith, "accuracy"] = log.loc[arith, "step"] / 100
    fig = figures.plot_training_curves(log)
    assert len(fig.axes) == 5  # 2 tasks x (train, eval) + arith's accuracy
    lines = _by_gid([line for ax in fig.axes for line in ax.lines], "")
    for paradigm, group in log[arith].groupby("paradigm"):
        line = lines[f"accuracy:arith:{paradigm}"]
        np.testing.assert_allclose(line.get_ydata(), group.sort_values("step")["accuracy"])
    assert "accuracy:text:ar" not in lines  # text logs no accuracy: no empty panel
    assert "text: accuracy" not in [ax.get_title() for ax in fig.axes]


def test_fine_tunes_are_drawn_after_the_ar_steps_they_start_from(derived: Derived) -> None:
    log = derived.run.train_log
    starts = items.fine_tune_starts(derived.run)
    assert starts == {"arith": 40.0, "text": 40.0}  # no params: init_from_ar defaults to true
    lines = _by_gid(
        [ln for ax in figures.plot_training_curves(log, starts).axes for ln in ax.lines], ""
    )
    ar_steps = log[(log["task"] == "arith") & (log["paradigm"] == "ar")]["step"].sort_values()
    np.testing.assert_allclose(lines["eval_loss:arith:ar"].get_xdata(), ar_steps)
    np.testing.assert_allclose(lines["eval_loss:arith:setdlm"].get_xdata(), ar_steps + 40)
    run = dataclasses.replace(derived.run, params={"train": {"arith": {"init_from_ar": False}}})
    assert items.fine_tune_starts(run) == {"text": 40.0}


# --- tables -----------------------------------------------------------------------------------


def test_best_config_table(derived: Derived) -> None:
    table = tables.best_config_table(derived.points).set_index("paradigm")
    points = derived.points
    for series in ("ar", "mdlm", "setdlm"):
        group = points[points["series"] == series]
        best = group.sort_values(["accuracy", "tokens_per_second"], ascending=False).iloc[0]
        assert table.loc[series, "best config"] == best["config"]
        assert table.loc[series, "accuracy [95% CI]"].startswith(f"{best['accuracy']:.3f} [")
    order = [
        "ar",
        "ar · setdiff",
        "ar · transformers",
        "ar · vllm",
        "ar · vllm (throughput)",
        "mdlm",
        "setdlm",
    ]
    assert list(table.index) == order  # AR engines next to our AR, then paradigm order


def test_speedup_and_likelihood_and_textgen_tables(derived: Derived) -> None:
    speed = tables.speedup_table(derived.run.comparisons).set_index("comparison")
    assert list(speed.index[:2]) == ["setdlm vs ar", "setdlm vs ar (lossy)"]
    assert speed.loc["setdlm vs ar", "speedup [95% CI]"] == "1.80 [1.50, 2.10]×"
    assert speed.loc["setdlm vs ar", "matched at"].startswith("within 0.02 of ar's accuracy;")
    assert speed.loc["setdlm vs ar", "accuracy diff, test [95% CI]"] == "-0.060 [-0.090, -0.030]"
    lossy = speed.loc["setdlm vs ar (lossy)"]
    assert lossy["speedup [95% CI]"] == "2.50 [2.20, 2.80]×"
    assert lossy["accuracy diff, test [95% CI]"] == "-0.100 [-0.140, -0.060]"
    assert lossy["method config"].startswith("threshold=0.7 window=8: acc 0.700")
    assert speed.loc["setdlm vs bd3lm", "speedup [95% CI]"] == "missing: no bd3lm rows"
    assert speed.loc["setdlm vs ar · vllm:greedy", "speedup [95% CI]"] == "0.60×"
    assert speed.loc["ar · vllm:greedy vs ar · setdiff", "speedup [95% CI]"] == "3.00 [2.50, 3.50]×"
    ppl = tables.likelihood_table(derived.run.evaluate)
    assert all(ppl.loc[ppl["paradigm"] == "ar", "PPL"].str.startswith("= "))
    assert all(ppl.loc[ppl["paradigm"] != "ar", "PPL"].str.startswith("≤ "))
    text = tables.textgen_table(derived.run.textgen, derived.run.textgen_rows)
    assert list(text["metric"][:2]) == ["infill_rouge_l", "infill_exact"]
    assert "my_new_metric" in set(text["metric"])  # unknown numeric keys are shown too
    assert not any("fingerprint" in m for m in text["metric"])
    value, low, high = map(float, re.findall(r"[\d.]+", text.iloc[0]["text · setdlm"]))
    assert low <= value <= high


def test_metrics_diff_table() -> None:
    a = pd.DataFrame({"path": ["m.json"] * 3, "key": ["x", "y", "z"], "value": [1.0, 2.0, 3.0]})
    b = pd.DataFrame({"path": ["m.json"] * 3, "key": ["x", "y", "w"], "value": [1.0, 3.0, 5.0]})
    diff = tables.metrics_diff_table(a, b, ("A", "B")).set_index("metric")
    assert list(diff.index) == ["w", "y", "z"]  # x is unchanged
    assert diff.loc["y", "change"] == "+1" and diff.loc["y", "change %"] == "+50.0"
    assert diff.loc["w", "A"] == "" and diff.loc["z", "B"] == ""


# --- the built report -------------------------------------------------------------------------


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.attributes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += [v or "" for _, v in attrs]
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")


def check_self_contained_html(path: Path) -> int:
    """Every <img> is a data: URI holding a valid PNG; nothing points off the page."""
    text = path.read_text()
    assert not re.search(r"https?://", text), "the report references a URL"
    parser = _Html()
    parser.feed(text)
    assert not parser.tags & {"script", "link", "iframe", "object", "embed"}
    for src in parser.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        Image.open(io.BytesIO(data)).verify()
    assert all(a.startswith("data:") or "/" not in a for a in parser.attributes if ":" in a)
    return len(parser.images)


def test_build_writes_markdown_html_and_figures(built: Path, derived: Derived) -> None:
    pngs = sorted(p.stem for p in (built / "figures").glob("*.png"))
    expected = sorted(m.item.name for m in make_items(derived) if isinstance(m.output, Figure))
    assert pngs == expected
    assert check_self_contained_html(built / "report.html") == len(pngs)
    md = (built / "report.md").read_text()
    for png in pngs:
        assert f"](figures/{png}.png)" in md
    for heading in (
        "## Missing inputs",
        "## Speed–quality trade-offs",
        "## Provenance",
        "### Speedup at matched accuracy",
        "### Perplexity",
        "### Text generation",
    ):
        assert heading in md
    assert "Not available" not in md
    assert "setdiff preset test && dvc repro" in md
    assert "`rev0`" in md and "| bench@arith | 1 | 1 |" in md and "2.13.0+cpu" in md
    assert "metrics/tradeoff/arith.json#setdlm_vs_bd3lm | missing: no bd3lm rows" in md


def _missing_rows(md: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if len(cells) == 4 and cells[2] in ("yes", "no"):
            rows[cells[0]] = (cells[1], cells[3])
    return rows


def test_missing_and_partial_inputs_are_reported(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    (root / "results/bench/arith.traces.jsonl").unlink()
    (root / "metrics/evaluate/text/mdlm.json").write_text("")
    bench = pd.read_csv(root / "results/bench/arith.csv")
    bench = bench[bench["paradigm"] != "mdlm"]
    bench = bench[~((bench["paradigm"] == "setdlm") & (bench["example"] >= 15))]
    bench.to_csv(root / "results/bench/arith.csv", index=False)
    (root / "results/baseline/arith.csv").write_text("task,paradigm,engine\n")
    skipped = {"status": "skipped", "reason": "server at http://127.0.0.1:9/v1 did not start"}
    meta = {"task": "arith", "engines": {"setdiff": {"status": "ran"}, "vllm": skipped}}
    _json(root / "results/baseline/arith.json", meta)
    (root / "models/text/ar/train_log.jsonl").write_text("not json\n")
    out = tmp_path / "out"
    build(root, out)
    md = (out / "report.md").read_text()
    rows = _missing_rows(md)
    problem, affects = rows["results/bench/arith.traces.jsonl"]
    assert problem == "not found"
    for title in (
        "Tokens accepted per forward",
        "Decode order vs left-to-right",
        "Window occupancy",
    ):
        assert f"{title} (disabled)" in affects
    assert rows["metrics/evaluate/text/mdlm.json"][0] == "empty (0 bytes)"
    assert "Perplexity (incomplete)" in rows["metrics/evaluate/text/mdlm.json"][1]
    assert "no rows for paradigm(s): mdlm" in md
    assert "partial: fewer examples for setdlm 'threshold=0.9 window=4' (15 of 20), " in md
    assert (
        rows["results/baseline/arith.csv"][0]
        == "missing columns: config, example, new_tokens, nfe, latency_s, exact"
    )
    assert rows["models/text/ar/train_log.jsonl"][0] == "unreadable: 1 invalid lines"
    problem, affects = rows["results/baseline/arith.json#vllm"]
    assert problem == "skipped: server at http[:]//127.0.0.1:9/v1 did not start"  # defanged
    assert "Baseline engines (incomplete)" in affects
    assert "Training curves (incomplete)" in rows["models/text/ar/train_log.jsonl"][1]
    assert md.count("**Not available:** needs `results/bench/arith.traces.jsonl`") == 3
    check_self_contained_html(out / "report.html")


def test_malformed_values_and_traces_are_dropped_and_counted(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    bench = pd.read_csv(root / "results/bench/arith.csv")
    bench["latency_s"] = bench["latency_s"].astype(object)
    bench.loc[0, "latency_s"] = "fast"
    bench.to_csv(root / "results/bench/arith.csv", index=False)
    with (root / "results/bench/arith.traces.jsonl").open("a") as f:
        f.write('{"paradigm": "ar", "config": "default", "example": 99, "steps": "oops"}\n{bad\n')
    derived = derive(load_run(root))
    problems = [(m.path, m.problem) for m in derived.run.missing if m.path.startswith("results")]
    assert problems == [
        (
            "results/bench/arith.csv",
            "partial: 1 non-numeric values, "
            "1 rows without example/new_tokens/nfe/latency_s dropped",
        ),
        ("results/bench/arith.csv", "partial: fewer examples for ar 'default' (19 of 20)"),
        ("results/bench/arith.traces.jsonl", "partial: 1 invalid lines skipped"),
        ("results/bench/arith.traces.jsonl", "partial: 1 traces with malformed steps skipped"),
    ]
    assert len(derived.run.rows) == N_EXAMPLES * (sum(len(c) for c in CONFIGS.values()) + 5) - 1
    assert len(derived.orders) == N_EXAMPLES * sum(len(c) for c in CONFIGS.values())


def _with_accuracy(root: Path, task: str = "arith") -> None:
    """Give `task`'s evaluate files the answer fields the evaluate stage writes for answer tasks."""
    for paradigm, accuracy in zip(PARADIGMS, (0.8, 0.55, 0.74), strict=True):
        path = root / f"metrics/evaluate/{task}/{paradigm}.json"
        data = json.loads(path.read_text())
        _json(path, data | {"accuracy": accuracy, "score": accuracy, "n_answers": 200})


def test_an_evaluate_file_without_its_fields_is_listed_not_dropped_silently(
    tmp_path: Path,
) -> None:
    root = write_run(tmp_path / "run")
    _with_accuracy(root)
    (root / "metrics/evaluate/arith/setdlm.json").write_text("{}")
    out = tmp_path / "out"
    main(["--root", str(root), "--out", str(out)])  # exit 0: the build never stops on bad input
    md = (out / "report.md").read_text()
    problem, affects = _missing_rows(md)["metrics/evaluate/arith/setdlm.json"]
    assert problem.startswith("field 'task' missing; field 'paradigm' missing;"), problem
    assert "Perplexity (incomplete)" in affects
    # ... and its numbers are not used: no row of {} (NaN everywhere) reaches a table.
    evaluate = load_run(root).evaluate
    assert set(evaluate[evaluate["task"] == "arith"]["paradigm"]) == {"ar", "mdlm"}
    assert not re.search(r"\bnan\b", md, re.IGNORECASE)


def test_a_nan_or_out_of_range_accuracy_is_listed_and_never_printed(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    _with_accuracy(root)
    path = root / "metrics/evaluate/arith/ar.json"
    path.write_text(path.read_text().replace('"accuracy": 0.8', '"accuracy": NaN'))
    mdlm = root / "metrics/evaluate/arith/mdlm.json"
    _json(mdlm, json.loads(mdlm.read_text()) | {"accuracy": 1.7})
    out = tmp_path / "out"
    main(["--root", str(root), "--out", str(out)])
    md = (out / "report.md").read_text()
    rows = _missing_rows(md)
    assert rows["metrics/evaluate/arith/ar.json"][0] == "field 'accuracy' is NaN"
    assert rows["metrics/evaluate/arith/mdlm.json"][0] == "field 'accuracy' = 1.7 outside [0, 1]"
    shown = md.replace("field 'accuracy' is NaN", "")  # the Missing inputs row names it
    assert not re.search(r"\bnan\b", shown, re.IGNORECASE) and "1.700" not in md
    assert "Answer accuracy on arith" in md and "setdlm 0.740" in md  # the valid file still shows


def test_a_bad_study_or_tradeoff_file_is_listed_with_the_field(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    _json(root / "metrics/setsize/arith.json", SETSIZE | {"rows": [{"paradigm": "setdlm"}]})
    tradeoff = _tradeoff()
    tradeoff["setdlm_vs_ar"] = tradeoff["setdlm_vs_ar"] | {"ci95": [1.5, float("inf")]}
    _json(root / "metrics/tradeoff/arith.json", tradeoff)
    run = load_run(root)
    problems = {m.path: m.problem for m in run.missing}
    assert problems["metrics/setsize/arith.json"] == (
        "field 'rows.0.accuracy' missing; field 'rows.0.set_size' missing"
    )
    assert problems["metrics/tradeoff/arith.json"] == "field 'setdlm_vs_ar.ci95[1]' is inf"
    assert run.setsize.empty and run.comparisons.empty


def test_empty_run_reports_everything_missing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    build(tmp_path, out)
    md = (out / "report.md").read_text()
    rows = _missing_rows(md)
    assert rows["params.yaml"][0] == "not found" and rows["dvc.lock"][0] == "not found"
    assert md.count("**Not available:**") == len(ITEMS)
    assert not list((out / "figures").glob("*.png"))
    assert check_self_contained_html(out / "report.html") == 0


def test_every_item_builds_without_error(derived: Derived) -> None:
    made = make_items(derived)
    assert [m.item.name for m in made if m.error or m.output is None] == []


# --- comparison -------------------------------------------------------------------------------


def test_compare_overlays_two_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=0, preset="smoke")
    b = write_run(tmp_path / "b", seed=1, speed=0.5, preset="default")
    out = tmp_path / "cmp"
    compare(a, b, out)
    md = (out / "report.md").read_text()
    assert "| params preset | smoke | default |" in md
    assert "| git_revision | rev0 | rev1 |" in md
    diff = tables.metrics_diff_table(flatten_metrics(a), flatten_metrics(b), ("a", "b"))
    assert len(diff) and f"| {diff.iloc[0]['path']} | {diff.iloc[0]['metric']} |" in md
    assert "Accuracy and tokens/s per configuration" in md and "Not available" not in md
    n_images = check_self_contained_html(out / "report.html")
    assert n_images == len(list((out / "figures").glob("*.png"))) == 4
    merged = merge([derive(load_run(a)), derive(load_run(b))], ("a", "b"))
    ax = figures.plot_quality_vs_throughput(merged.points).axes[0]
    dots = _by_gid(ax.lines, "points:arith:")
    assert {"setdlm (a)", "setdlm (b)", "ar (a)", "ar (b)"} <= set(dots)
    fronts = _by_gid(ax.lines, "frontier:arith:")
    assert fronts["setdlm (a)"].get_linestyle() != fronts["setdlm (b)"].get_linestyle()
    assert set(_legend(ax)) >= {f"{p} ({r})" for p in PARADIGMS for r in "ab"}


def test_compare_flags_accuracies_outside_the_reference_seed_spread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B's accuracy is checked against A's seeds and A's own run, min to max, inclusive."""

    def frame(values: dict[str, float]) -> pd.DataFrame:
        rows = [(f"metrics/evaluate/arith/{p}.json", "accuracy", v) for p, v in values.items()]
        return pd.DataFrame(rows, columns=["path", "key", "value"])

    a = frame({"setdlm": 0.90, "bd3lm": 0.86, "mdlm": 0.66})
    b = frame({"setdlm": 0.91, "bd3lm": 0.938, "mdlm": 0.66})
    seeds = pd.DataFrame(
        {
            "task": ["arith"] * 3,
            "paradigm": ["setdlm", "bd3lm", "mdlm"],
            "accuracies": [[0.88, 0.92], [0.85, 0.87], [0.60, 0.62]],
        }
    )
    table = seed_spread_table(a, b, seeds).set_index("paradigm")
    assert table.loc["setdlm", "B outside it"] == "no"  # inside 0.88-0.92
    assert table.loc["bd3lm", "B outside it"] == "**yes**"  # above 0.85-0.87
    assert table.loc["mdlm", "B outside it"] == "no"  # the boundary (A's own run) is inside
    assert table.loc["bd3lm", "A's seed range"] == "0.850–0.870 (3 runs)"
    missing = seed_spread_table(a, frame({}), seeds).set_index("paradigm")
    assert set(missing["B outside it"]) == {"–"}

    # In the comparison report: the section, and one log line per flagged paradigm.
    run_a = write_run(tmp_path / "a", seed=0, preset="smoke")
    run_b = write_run(tmp_path / "b", seed=1, speed=0.5, preset="default")
    for run, value in ((run_a, 0.90), (run_b, 0.95)):
        path = run / "metrics/evaluate/arith/setdlm.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "accuracy": value}))
    seeds_file = run_a / "metrics" / "seeds" / "arith.json"
    seeds_file.parent.mkdir(parents=True, exist_ok=True)
    row = {"seeds": [1, 2], "accuracies": [0.88, 0.91], "n": 2, "mean": 0.895}
    seeds_file.write_text(json.dumps({"task": "arith", "paradigms": {"setdlm": row}}))
    with caplog.at_level("WARNING", logger="reports.compare"):
        compare(run_a, run_b, tmp_path / "cmp")
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "## Against the seed spread" in md
    assert "| arith | setdlm | 0.900 | 0.950 | 0.880–0.910 (3 runs) | **yes** |" in md
    flagged = [r.message for r in caplog.records if "outside" in r.message]
    assert flagged == [
        "arith setdlm: b's accuracy 0.950 is outside a's seed range 0.880–0.910 (3 runs)"
    ]


CHECK_IMAGES = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const ok = images.filter(i => i.complete && i.naturalWidth > 0).length;
  const out = document.createElement("pre");
  out.textContent = `RENDERED ${ok} OF ${images.length}`;
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)"
)
def test_html_renders_offline_in_headless_chromium(built: Path, tmp_path: Path) -> None:
    """Every embedded image decodes in a real browser with all networking disabled."""
    page = tmp_path / "check.html"
    page.write_text(
        (built / "report.html").read_text().replace("</body>", CHECK_IMAGES + "</body>")
    )
    command = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    n = len(list((built / "figures").glob("*.png")))
    assert f"RENDERED {n} OF {n}" in dom
    # A screenshot of the report itself, as a reader sees it: a page with text and figures.
    shot = tmp_path / "report.png"
    screenshot = [c for c in command if c not in ("--dump-dom", page.as_uri())]
    screenshot += [
        "--window-size=1280,4000",
        f"--screenshot={shot}",
        (built / "report.html").as_uri(),
    ]
    subprocess.run(screenshot, capture_output=True, timeout=120, check=True)
    with Image.open(shot) as image:
        assert image.size == (1280, 4000)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # not a blank or error page


def test_findings_state_accuracy_gaps_speedup_and_backbone(derived: Derived) -> None:
    evaluate = pd.DataFrame(
        {
            "task": ["arith"] * 3,
            "paradigm": ["setdlm", "ar", "mdlm"],
            "accuracy": [0.85, 0.9, 0.5],
            "n_answers": [500, 500, 500],
        }
    )
    setsize = pd.DataFrame(
        {
            "task": ["arith"] * 2,
            "paradigm": ["setdlm"] * 2,
            "set_size": [8, 2],
            "window": [8, 2],
            "accuracy": [0.7, 0.85],
            "n_examples": [500, 500],
            "model": ["fine-tuned from AR"] * 2,
        }
    )
    lines = findings.findings(evaluate, derived.run.comparisons, derived.run.backbone, setsize)
    assert lines[0].startswith("Answer accuracy on arith (500 test prompts, greedy): ar 0.900 [")
    assert "setdlm 0.850 [0.816, 0.879], -5.0 pts vs ar" in lines[0]
    assert "mdlm 0.500" in lines[0] and lines[0].index("mdlm") < lines[0].index("setdlm")
    assert lines[1] == (
        "setdlm at other set sizes on arith: D = 2, W = 2 (fine-tuned from AR): 0.850 "
        "[0.816, 0.879], -5.0 pts vs ar; D = 8, W = 8 (fine-tuned from AR): 0.700 "
        "[0.658, 0.739], -20.0 pts vs ar."
    )
    assert lines[2].startswith("setdlm decodes 1.80× [95% CI 1.50–2.10] as many tokens/s")
    assert "on arith at batch 1 (within 0.02 of ar's accuracy;" in lines[2]
    assert lines[2].endswith("accuracy 0.740 against AR's 0.800).")
    regime = findings.speedup_sentences(derived.run.comparisons, derived.run.fingerprints)[0]
    assert "on arith at batch 1, 1 thread, x86_64 (within" in regime
    assert "`4-heads` (-1.0 pts" in lines[3] and "`base` (-20.0 pts)" in lines[3]
    lo, hi = findings.wilson_interval(0.0, 10)
    assert lo == 0.0 and 0.27 < hi < 0.29  # the Wilson interval, not the degenerate normal one


def test_report_opens_with_what_the_run_shows(built: Path) -> None:
    text = (built / "report.md").read_text()
    assert text.index("What this run shows") < text.index("Speed")
    assert "setdlm decodes 1.80×" in text
    assert "setdlm at other set sizes on arith: D = 2, W = 2: 0.930 [" in text


def test_report_has_the_set_size_table(built: Path) -> None:
    text = (built / "report.md").read_text()
    section = text[text.index("Set size") :]
    assert "0.930 [0.886, 0.958]" in section[:3000] and "main run" in section[:3000]


def test_one_tokens_per_forward_per_configuration_in_histogram_and_tables(
    derived: Derived,
) -> None:
    """The histogram's legend gives each configuration the bench summary's tokens/forward (the
    scatter's x and the tables' column), not its own mean of committed set sizes."""
    per_forward = items.tokens_per_forward(derived.points)
    fig = figures.plot_set_size_histogram(derived.sizes, per_forward)
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]
    assert labels
    for (task, paradigm, config), value in per_forward.items():
        if ((derived.sizes["paradigm"] == paradigm) & (derived.sizes["config"] == config)).any():
            assert f"{config} ({value:.2f} tokens/forward)" in labels, (task, paradigm, config)


def test_figures_read_in_a_readers_units(derived: Derived) -> None:
    """Latency ticks in ms; the accuracy axis around the data; the Optuna panel named by task
    and preset, not by its storage key."""
    ax = figures.plot_quality_vs_latency(derived.points).axes[0]
    assert "ms" in ax.get_xlabel()
    assert ax.xaxis.get_major_formatter()(0.02, 0) == "20"
    low, high = ax.get_ylim()
    ours = derived.points[derived.points["task"] == "arith"]
    assert low <= ours["accuracy"].min() and high >= ours["accuracy"].max()
    assert low > 0 or ours["accuracy_lo"].min() < 0.03
    assert figures._study_title("arith", "arith-default-6e10f2c2") == "arith, default preset"


def test_run_facts_answer_a_reviewer(derived: Derived) -> None:
    facts = tables.run_facts_table(
        derived.run.params, derived.run.comparisons, derived.run.fingerprints
    ).set_index("fact")["value"]
    assert facts["arith: train / valid / test examples"] == "2000 / 100 / 100"
    assert facts["arith: ar training"] == "seed 0, 2 thread(s), 40 steps"
    assert facts["arith: diffusion training"] == "seed 0, default thread(s), 20 steps"
    assert facts["arith: setdlm vs ar, operating point"] == "chosen on 200 validation prompts"
    assert facts["machine"].startswith("x86_64")
    assert "as many at a time as their threads fit the cores" in facts["stages"]
