"""reports.analysis: statistics (intervals, Pareto fronts, decode-order metrics, accuracy under
parallelism) and the findings sentences, on fixed frames and the synthetic run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from report.report_run import N_EXAMPLES, THROUGHPUT
from reports.analysis import findings, stats
from reports.items import Derived, ablation_knobs
from reports.render import figures


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
    fallback = stats.summarize_configs(rows)  # no aggregate reported: concurrency x rate
    vllm = fallback[fallback["config"] == "greedy concurrency=8"].iloc[0]
    group = rows[rows["config"] == "greedy concurrency=8"]
    expected = 8 * group["new_tokens"].sum() / group["latency_s"].sum()
    assert vllm["tokens_per_second"] == pytest.approx(expected)


def test_bootstrap_ci_edge_cases() -> None:
    assert np.isnan(stats.bootstrap_mean_ci(np.array([]))[0])
    assert stats.bootstrap_mean_ci(np.ones(5)) == (1.0, 1.0)
    low, high = stats.bootstrap_mean_ci(np.r_[np.zeros(50), np.ones(50)])
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
    binned = stats.bin_knobs(trials)
    assert binned["param_window"].equals(trials["param_window"])
    assert binned["param_threshold"].nunique() == 5
    assert ablation_knobs(binned) == ("param_window", "param_threshold")
    fig = figures.plot_ablation_heatmaps(binned, "param_window", "param_threshold")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == sorted(labels, key=lambda t: float(t.split("–")[0]))


def test_pareto_mask() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0, 2.5, 3.0], "accuracy": [0.9, 0.8, 0.5, 0.4, 0.5]})
    assert list(stats.pareto_mask(frame, "x")) == [True, True, True, False, False]
    assert list(stats.pareto_mask(frame, "x", larger_x=False)) == [
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
    assert stats.order_metrics([[10], [11], [12]])["kendall_tau"] == 1.0
    assert stats.order_metrics([[12], [11], [10]])["kendall_tau"] == -1.0
    assert np.isnan(stats.order_metrics([[10, 11, 12]])["kendall_tau"])
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, 15).tolist(), rng.integers(0, 4, 15).tolist()
    assert stats.kendall_tau_b(np.array(x), np.array(y)) == pytest.approx(_tau_brute(x, y))
    # frontier 10 -> decodes 12 (distance 2) and 10 (0); frontier 11 -> 13 (2), 11 (0)
    metrics = stats.order_metrics([[10, 12], [11, 13]])
    assert metrics["frontier_distance"] == 1.0
    assert metrics["max_frontier_distance"] == 2.0
    assert stats.order_metrics([[10], [11]])["frontier_distance"] == 0.0


def test_accuracy_under_parallelism_follows_d3llm() -> None:
    aup = stats.accuracy_under_parallelism
    assert aup([1.0], [94.0], 94.0) == pytest.approx(94.0)  # plain AR: its accuracy
    assert aup([2.0], [90.0], 94.0) == pytest.approx(180.0)  # one point: rho * y
    # Trapezoids of y * W(y), W(y) = min(exp(-3 (1 - y / y_max)), 1); a point more than 5
    # points below the first is left out, whatever its parallelism.
    weight = np.exp(-3 * (1 - 90 / 94))
    expected = 1 * 94 + 0.5 * (3 - 1) * (94 + 90 * weight)
    assert aup([3.0, 1.0, 9.0], [90.0, 94.0, 80.0], 94.0) == pytest.approx(expected)
    assert np.isnan(aup([], [], 94.0))


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


@pytest.mark.parametrize(
    ("p", "k", "expected"),
    [
        (0.95, 1, 3.8415),  # tabulated values
        (0.95, 2, 5.9915),
        (0.95, 3, 7.8147),
        (0.975, 2, -2 * math.log(0.025)),  # chi-square(2) is exponential: closed form
        (0.025, 2, -2 * math.log(0.975)),
        (0.5, 40, 39.3354),
    ],
)
def test_chi2_quantile_matches_known_values(p: float, k: int, expected: float) -> None:
    assert stats.chi2_quantile(p, k) == pytest.approx(expected, rel=1e-4)


def test_sd_interval_of_three_seeds_is_wide() -> None:
    """Three seeds at sd 0.038 (bd3lm's) cannot tell 0.03 from 0.2: the interval holds both."""
    lo, hi = stats.sd_interval(0.038, 3)
    assert lo == pytest.approx(0.038 * math.sqrt(2 / (-2 * math.log(0.025))), rel=1e-6)
    assert lo < 0.03 < 0.2 < hi
    assert all(math.isnan(v) for v in stats.sd_interval(0.038, 1))
