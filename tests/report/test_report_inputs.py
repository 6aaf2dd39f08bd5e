"""reports.inputs: reading a run's artifacts, and the account of every input it could not use
(missing, empty, malformed, partial), on the synthetic run of `report_run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from report.report_run import (
    CONFIGS,
    N_EXAMPLES,
    PARADIGMS,
    SETSIZE,
    _json,
    _tradeoff,
    by_gid,
    check_self_contained_html,
    write_run,
)
from reports.build import build, main
from reports.inputs import optuna
from reports.inputs.run import load_run
from reports.items import ITEMS, Derived, derive
from reports.render import figures


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


def test_the_curve_stage_gives_the_training_logs_their_accuracy(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    points = [{"step": 20, "accuracy": 0.25}, {"step": 40, "accuracy": 0.75}]
    curve = {"task": "arith", "paradigm": "setdlm", "n_examples": 8, "points": points}
    _json(root / "metrics/curve/arith/setdlm.json", curve)
    (root / "metrics/curve/arith/mdlm.json").unlink()
    run = load_run(root)
    log = run.train_log.set_index(["task", "paradigm", "step"])["accuracy"]
    assert log.loc["arith", "setdlm"].to_dict() == pytest.approx(
        {10: float("nan"), 20: 0.25, 30: float("nan"), 40: 0.75}, nan_ok=True
    )
    assert log.drop(("arith", "setdlm")).isna().all()  # no points: no accuracy
    missing = [(m.path, m.kind, m.optional) for m in run.missing if m.kind == "curve"]
    assert missing == [("metrics/curve/arith/mdlm.json", "curve", True)]


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
    assert optuna.front_axis(trials) == "nfe_mean"
    ax = figures.plot_optuna_pareto(trials, "nfe_mean").axes[0]
    best = by_gid(ax.collections, "pareto:arith:arith-smoke-abc:")["setdlm"].get_offsets()
    assert sorted(best[:, 0]) == sorted(trials.loc[trials["is_pareto"], "nfe_mean"])
    assert "7 complete, 1 fail" in ax.get_title()
    (root / "ablations/arith/arith-smoke-abc/study.json").write_text("{")
    problems = {m.path: m.problem for m in load_run(root).missing if m.kind == "trials"}
    assert problems["ablations/arith/arith-smoke-abc/study.json"].startswith("unreadable")


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
