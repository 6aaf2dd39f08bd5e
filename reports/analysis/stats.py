"""Derived statistics over tidy frames: configuration summaries with bootstrap CIs, Pareto fronts,
and decode-order analytics from per-step traces. Pure functions (frame in, frame out); no I/O.

The summary uses the pipeline's own rule (`setdiff.tradeoff`, re-stated here because reports do
not import `setdiff`): accuracy = mean exact match over examples, tokens/s = total new tokens /
total latency, tokens per forward = total new tokens / total forwards, latency and NFE = means.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from reports.analysis.series import paradigm_order, series_label

KEY = ["task", "source", "paradigm", "engine", "regime", "concurrency", "config"]
"""Columns identifying one measured configuration (source: bench or baseline file)."""


def bootstrap_mean_ci(
    values: np.ndarray, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (resampling examples with replacement).

    Returns (nan, nan) for no values; (v, v) for one value or constant values.
    """
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


Z95 = 1.959964


def wilson_interval(accuracy: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion measured on n trials: the report's one interval
    for an accuracy (exact match), wherever it is shown. Ratios and differences of two methods
    on the same prompts get a paired percentile bootstrap instead (`setdiff.tradeoff`)."""
    if n <= 0 or math.isnan(accuracy):
        return math.nan, math.nan
    denom = 1 + Z95**2 / n
    centre = (accuracy + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(accuracy * (1 - accuracy) / n + Z95**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def sd_interval(sd: float, n: int) -> tuple[float, float]:
    """95% interval of a spread's true sd from the sample sd of `n` runs (normal runs: the
    sample variance times n - 1 over the variance is chi-square with n - 1 degrees of freedom).
    Three seeds pin an sd only to within about half of it below and six times it above."""
    if n < 2 or math.isnan(sd):
        return math.nan, math.nan
    k = n - 1
    return sd * math.sqrt(k / chi2_quantile(0.975, k)), sd * math.sqrt(k / chi2_quantile(0.025, k))


def chi2_quantile(p: float, k: int) -> float:
    """The `p` quantile of chi-square with `k` degrees of freedom, by bisection on its CDF (the
    regularized lower incomplete gamma P(k/2, x/2), summed as its power series)."""

    def cdf(x: float) -> float:
        a, h = k / 2, x / 2
        term = total = 1 / a
        for n in range(1, 500):
            term *= h / (a + n)
            total += term
            if term < total * 1e-15:
                break
        return math.exp(a * math.log(h) - h - math.lgamma(a)) * total

    lo, hi = 0.0, 2.0 * k + 10
    while cdf(hi) < p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _summarize_group(group: pd.DataFrame) -> pd.Series:
    quality = group["exact"].astype(float)
    if quality.isna().all() and "score" in group:
        quality = group["score"].astype(float)  # tasks without answers: the task's score
        low, high = bootstrap_mean_ci(quality.to_numpy())  # a mean score, not a proportion
    else:
        low, high = wilson_interval(float(quality.mean()), int(quality.notna().sum()))
    tokens, latency, nfe = group["new_tokens"].sum(), group["latency_s"].sum(), group["nfe"].sum()
    concurrency = int(group["concurrency"].iloc[0])
    rate = tokens / latency if latency else math.nan
    return pd.Series(
        {
            "accuracy": quality.mean(),
            "accuracy_lo": low,
            "accuracy_hi": high,
            # Throughput regime: latency is per request with `concurrency` in flight; this
            # estimate is replaced by the engine's measured aggregate when it is reported.
            "tokens_per_second": rate * concurrency,
            "tokens_per_forward": tokens / nfe if nfe else math.nan,
            "latency_s": group["latency_s"].mean(),
            "nfe": group["nfe"].mean(),
            "peak_mem_mb": group["peak_mem_mb"].max() if "peak_mem_mb" in group else math.nan,
            "window": group["window"].iloc[0] if "window" in group else math.nan,
            "threshold": group["threshold"].iloc[0] if "threshold" in group else math.nan,
            "n": len(group),
        }
    )


def summarize_configs(rows: pd.DataFrame, throughput: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per configuration: accuracy with its 95% Wilson interval, speed, NFE, memory,
    series.

    Args:
        rows: results rows (one per example x configuration), columns of `results/bench/*.csv`.
        throughput: measured aggregate tokens/s (task, engine, concurrency, tokens_per_second)
            of throughput-regime configurations; they replace the per-request estimate.
    Returns:
        Columns `KEY` + series, accuracy, accuracy_lo, accuracy_hi, tokens_per_second,
        tokens_per_forward, latency_s, nfe, peak_mem_mb, window, threshold, n.
    """
    if rows.empty:
        return pd.DataFrame(columns=[*KEY, "series", "accuracy", "tokens_per_second"])
    defaults = {"regime": "latency", "concurrency": 1, "source": "bench"}
    rows = rows.assign(
        **{c: rows.get(c, pd.Series(v, index=rows.index)).fillna(v) for c, v in defaults.items()}
    ).astype({"concurrency": int})
    parts = [_summarize_group(group).rename(key) for key, group in rows.groupby(KEY, sort=False)]
    points = pd.DataFrame(parts)
    points.index = pd.MultiIndex.from_tuples(points.index, names=KEY)
    points = points.reset_index().astype({"n": int})
    if throughput is not None and not throughput.empty:
        measured = throughput.set_index(["task", "engine", "concurrency"])["tokens_per_second"]
        keys = pd.MultiIndex.from_frame(points[["task", "engine", "concurrency"]])
        use = (points["regime"] == "throughput").to_numpy() & keys.isin(measured.index)
        points.loc[use, "tokens_per_second"] = measured.reindex(keys[use]).to_numpy()
    points["series"] = [
        series_label(r.paradigm, r.engine, r.regime, r.concurrency, external=r.source != "bench")
        for r in points.itertuples()
    ]
    return sort_paradigms(points)


def sort_paradigms(
    frame: pd.DataFrame, *, first: tuple[str, ...] = ("task",), then: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Rows sorted by `first` columns, then canonical paradigm order, then `then` (stable)."""
    order = {p: i for i, p in enumerate(paradigm_order(frame["paradigm"]))}
    keys = [c for c in first if c in frame]
    ranked = frame.assign(_rank=frame["paradigm"].map(order))
    ranked = ranked.sort_values([*keys, "_rank", *then], kind="stable")
    return ranked.drop(columns="_rank").reset_index(drop=True)


def pareto_mask(
    frame: pd.DataFrame, x: str, y: str = "accuracy", *, larger_x: bool = True
) -> pd.Series:
    """True for rows not dominated in (`x` better, `y` higher); `larger_x`: more x is better.

    A row is dominated when another row is at least as good on both and better on one; exact
    duplicates keep the first. NaN rows are never on the front.
    """
    sign = 1.0 if larger_x else -1.0
    xs, ys = frame[x].to_numpy(float) * sign, frame[y].to_numpy(float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    order = sorted(np.flatnonzero(keep), key=lambda i: (-xs[i], -ys[i]))
    mask, best = np.zeros(len(frame), dtype=bool), -math.inf
    for i in order:
        if ys[i] > best:
            mask[i], best = True, ys[i]
    return pd.Series(mask, index=frame.index)


def accuracy_under_parallelism(
    tokens_per_forward: Sequence[float],
    accuracy: Sequence[float],
    best: float,
    *,
    alpha: float = 3.0,
    drop: float = 5.0,
) -> float:
    """d3LLM's AUP (Accuracy Under Parallelism) of one method's operating points, accuracies
    in points (0-100): sorted by tokens per forward rho, the points within `drop` points of
    the first one's accuracy y_1 are kept; AUP = rho_1 * y_1 plus the trapezoids of
    y * W(y) between consecutive points, with the quality weight
    W(y) = min(exp(-alpha * (1 - y / best)), 1) and `best` the best accuracy of any method on
    the task. One point gives rho * y; plain AR (rho = 1) gives its accuracy."""
    pairs = sorted(zip(map(float, tokens_per_forward), map(float, accuracy), strict=True))
    if not pairs:
        return math.nan
    floor = pairs[0][1] - drop
    kept = [(rho, y) for rho, y in pairs if y >= floor]

    def weighted(y: float) -> float:
        return y * min(math.exp(-alpha * (1 - y / best)), 1.0)

    area = kept[0][0] * kept[0][1]
    for (rho0, y0), (rho1, y1) in itertools.pairwise(kept):
        area += 0.5 * (rho1 - rho0) * (weighted(y0) + weighted(y1))
    return area


# --- decode traces ----------------------------------------------------------------------------


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of two sequences (ties allowed); nan when either is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2:
        return math.nan
    sx = np.sign(x[:, None] - x[None, :])
    sy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(x.size, k=1)
    concordance = float((sx * sy)[upper].sum())
    n_x, n_y = float(np.abs(sx[upper]).sum()), float(np.abs(sy[upper]).sum())  # untied pairs
    return concordance / math.sqrt(n_x * n_y) if n_x and n_y else math.nan


def order_metrics(steps: list[list[int]]) -> dict[str, float]:
    """Decode-order statistics of one trace (list of positions decoded per forward).

    - kendall_tau: tau-b between position and the forward that decoded it (1 = left-to-right;
      ties within a forward are ties).
    - frontier_distance: mean over decoded positions of (position - frontier), where the frontier
      is the leftmost generated position still undecoded before that forward (0 = AR-like).
    - max_frontier_distance: the largest such distance.
    """
    positions = [p for step in steps for p in step]
    forwards = [k for k, step in enumerate(steps) for _ in step]
    pending, distances = sorted(set(positions)), []
    done: set[int] = set()
    cursor = 0
    for step in steps:
        while cursor < len(pending) and pending[cursor] in done:
            cursor += 1
        frontier = pending[cursor] if cursor < len(pending) else math.inf
        distances += [p - frontier for p in step]
        done.update(step)
    return {
        "kendall_tau": kendall_tau_b(np.array(positions), np.array(forwards)),
        "frontier_distance": float(np.mean(distances)) if distances else math.nan,
        "max_frontier_distance": float(np.max(distances)) if distances else math.nan,
    }


def trace_orders(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per trace: task, paradigm, config, example + `order_metrics`."""
    if traces.empty:
        return pd.DataFrame(columns=["task", "paradigm", "config", "example", "kendall_tau"])
    metrics = pd.DataFrame([order_metrics(s) for s in traces["steps"]], index=traces.index)
    ids = traces[["task", "paradigm", "config", "example"]]
    return sort_paradigms(pd.concat([ids, metrics], axis=1))


def trace_set_sizes(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per forward: task, paradigm, config, example, forward, set_size (tokens accepted)."""
    columns = ["task", "paradigm", "config", "example", "forward", "set_size"]
    records = [
        (t.task, t.paradigm, t.config, t.example, k, len(step))
        for t in traces.itertuples(index=False)
        for k, step in enumerate(t.steps)
    ]
    frame = pd.DataFrame(records, columns=columns)
    return sort_paradigms(frame) if not frame.empty else frame


def knob_grid(points: pd.DataFrame, paradigm: str = "setdlm") -> pd.DataFrame:
    """Bench configurations of `paradigm` as trials-like rows (param_window, param_threshold)."""
    ours = points[(points["paradigm"] == paradigm) & (points["engine"] == "setdiff")]
    threshold = ours["threshold"].map(lambda v: "off" if pd.isna(v) else f"{float(v):g}")
    window = ours["window"].map(lambda v: "default" if pd.isna(v) else f"{int(v)}")
    return pd.DataFrame(
        {
            "task": ours["task"],
            "state": "COMPLETE",
            "param_window": window,
            "param_threshold": threshold,
            "accuracy": ours["accuracy"],
            "tokens_per_second": ours["tokens_per_second"],
        }
    )


def bin_knobs(trials: pd.DataFrame, max_levels: int = 8) -> pd.DataFrame:
    """Trials with each numeric ``param_*`` column of more than `max_levels` distinct values
    (a continuous Optuna knob) replaced by quantile-bin labels ``"lo–hi"``, for heatmaps."""
    out = trials.copy()
    for column in [c for c in trials.columns if c.startswith("param_")]:
        values = pd.to_numeric(trials[column], errors="coerce")
        if values.notna().all() and values.nunique() > max_levels:
            bins = pd.qcut(values, q=min(max_levels, 5), duplicates="drop")
            out[column] = bins.map(lambda b: f"{b.left:.3g}–{b.right:.3g}").astype(str)
    return out
