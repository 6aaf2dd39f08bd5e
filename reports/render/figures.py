"""One function per figure: a tidy frame in, a matplotlib `Figure` out. No I/O, no theme changes.

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so nothing leaks
between calls. Every plotted series carries a ``gid`` (``"<what>:<task>:<series>"``) so tests
can find it and compare its data with the tables. When a frame has a ``run`` column (comparison
mode), each run is drawn in its own line style and labelled ``"<series> (<run>)"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import Bbox

from reports.analysis.series import paradigm_order
from reports.analysis.stats import pareto_mask, wilson_interval
from reports.render.style import (
    MUTED_COLOR,
    PARADIGM_COLORS,
    RUN_LINESTYLES,
    series_color,
    series_marker,
    shades,
)

QUALITY_X: dict[str, tuple[str, bool, bool]] = {
    "tokens_per_second": ("tokens / s (higher is faster)", True, True),
    "tokens_per_forward": ("tokens per forward (higher = fewer model calls)", True, False),
    "latency_s": ("latency per example, ms (lower is faster)", False, True),
}
"""x column -> (axis label, larger is better, log scale)."""


def _grid(nrows: int, ncols: int, width: float = 5.5, height: float = 4.0) -> np.ndarray:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    return fig.subplots(nrows, ncols, squeeze=False)


def _unique(frame: pd.DataFrame, column: str) -> list:
    return list(dict.fromkeys(frame[column])) if column in frame else [None]


def _runs(frame: pd.DataFrame) -> list[tuple[int, object, pd.DataFrame]]:
    """(index, run label or None, rows of that run)."""
    if "run" not in frame:
        return [(0, None, frame)]
    return [(i, run, frame[frame["run"] == run]) for i, run in enumerate(_unique(frame, "run"))]


def _label(name: str, run: object) -> str:
    return name if run is None else f"{name} ({run})"


def _short_config(config: object) -> str:
    """``threshold=0.9 window=4`` -> ``τ0.9 W4`` (labels that fit beside a point)."""
    text = str(config)
    pairs = (("verify=True", "verify"), ("threshold=", "τ"), ("window=", "W"), ("order=", ""))
    for long, short in (*pairs, ("=", "")):
        text = text.replace(long, short)
    return text


def _draw_quality_series(
    ax: Axes,
    group: pd.DataFrame,
    x: str,
    label: str,
    run_index: int,
    gid: str,
    labelled: pd.Series | None = None,
) -> None:
    """Points with 95% CI bars, the series' Pareto front as a line; the configurations that
    `labelled` marks (the task's overall Pareto front) get their short config label."""
    first = group.iloc[0]
    color = series_color(first["paradigm"], first["engine"])
    group = group.sort_values(x)
    y = group["accuracy"].to_numpy(float)
    low = (y - group["accuracy_lo"].to_numpy(float)).clip(min=0)
    high = (group["accuracy_hi"].to_numpy(float) - y).clip(min=0)
    bars = ax.errorbar(
        group[x].to_numpy(float),
        y,
        yerr=np.nan_to_num(np.vstack([low, high])),
        fmt=series_marker(first["engine"], first["regime"], first.get("source", "bench")),
        color=color,
        mfc=color if run_index == 0 else "white",
        capsize=3,
        markersize=6,
        label=label,
    )
    bars.lines[0].set_gid(f"points:{gid}")
    bars.lines[2][0].set_gid(f"ci:{gid}")
    _, larger, _ = QUALITY_X[x]
    front = group[pareto_mask(group, x, larger_x=larger)].sort_values(x)
    ax.plot(
        front[x].to_numpy(float),
        front["accuracy"].to_numpy(float),
        color=color,
        linestyle=RUN_LINESTYLES[run_index % len(RUN_LINESTYLES)],
        linewidth=1.5,
        alpha=0.8,
        gid=f"frontier:{gid}",
        label=f"_frontier {label}",
    )
    marked = group if labelled is None else group[labelled.reindex(group.index, fill_value=False)]
    if run_index == 0 and len(group) > 1:
        for row in marked.itertuples():
            ax.annotate(
                _short_config(row.config),
                (getattr(row, x), row.accuracy),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color=color,
            )


LOSSLESS_MARKERS = ("d", "p", "h", "v", "*", "<")
"""Markers of the lossless stage's methods, in the stage's order (hollow, one per method)."""


def _draw_lossless(ax: Axes, lossless: pd.DataFrame, task: object) -> None:
    """The lossless stage's speculative methods of `task` (greedy, batch 1, each exactly its
    reference decode): hollow markers in the method's colour, one legend entry each, with 95%
    Wilson bars; the plain decodes they speed up (1 token per forward) are the bench's points."""
    rows = lossless[(lossless["task"] == task) & (lossless["tokens_per_forward"] > 1)]
    for i, r in enumerate(rows.itertuples(index=False)):
        method = str(r.method)
        paradigm = "setdlm" if method.startswith("setdlm") else "ar"
        color = series_color(paradigm, "transformers" if method.startswith("hf") else "setdiff")
        low, high = wilson_interval(float(r.accuracy), int(r.n))
        bars = ax.errorbar(
            [float(r.tokens_per_forward)],
            [float(r.accuracy)],
            yerr=np.nan_to_num([[float(r.accuracy) - low], [high - float(r.accuracy)]]),
            fmt=LOSSLESS_MARKERS[i % len(LOSSLESS_MARKERS)],
            color=color,
            mfc="white",
            markersize=8,
            capsize=3,
            label=f"{method} (lossless)",
        )
        bars.lines[0].set_gid(f"lossless:{task}:{method}")


def _plot_quality_vs(points: pd.DataFrame, x: str, lossless: pd.DataFrame | None = None) -> Figure:
    label, _, log = QUALITY_X[x]
    tasks = _unique(points, "task")
    axes = _grid(1, len(tasks), width=7.5)  # the legend sits outside, to the right
    _, larger, _ = QUALITY_X[x]
    for ax, task in zip(axes[0], tasks, strict=True):
        for run_index, run, frame in _runs(_one_ar_per_engine(points[points["task"] == task])):
            overall = pareto_mask(frame, x, larger_x=larger)
            for series, group in frame.groupby("series", sort=False):
                name = _label(str(series), run)
                gid = f"{task}:{name}"
                _draw_quality_series(ax, group, x, name, run_index, gid, labelled=overall)
        if lossless is not None and not lossless.empty:
            _draw_lossless(ax, lossless, task)
        ax.set(xlabel=label, ylabel="accuracy (exact match)", title=str(task))
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=30))
            scale = 1000.0 if x == "latency_s" else 1.0  # latency drawn in s, labelled in ms
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _, k=scale: f"{v * k:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        mine = points[points["task"] == task]
        if len(mine) and mine["accuracy"].between(0, 1).all():
            ax.set_ylim(*_accuracy_limits(mine))
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        hide_overprinted_labels(ax)
    fig = axes[0, 0].figure
    fig.suptitle("bars: 95% Wilson interval of the accuracy; lines: Pareto front", fontsize="small")
    return fig


def hide_overprinted_labels(ax: Axes) -> list[str]:
    """Hide each point label that would overprint one kept before it (in drawing order); the
    hidden labels' texts, in order. Lays the figure out first (as saving it will), so the
    boxes are the drawn ones. A hidden label's point stays drawn, and the tables name every
    configuration."""
    ax.figure.draw_without_rendering()
    kept: list[Bbox] = []
    hidden = []
    for text in ax.texts:
        box = text.get_window_extent()
        if any(box.overlaps(k) for k in kept):
            text.set_visible(False)
            hidden.append(text.get_text())
        else:
            kept.append(box)
    return hidden


def _accuracy_limits(points: pd.DataFrame) -> tuple[float, float]:
    """The accuracy axis around the data (intervals included), not 0-1: a 0.83-0.98 cluster
    stays readable; a margin of 2 points, clipped to [0, 1]."""
    low = points.get("accuracy_lo", points["accuracy"]).astype(float).min()
    high = points.get("accuracy_hi", points["accuracy"]).astype(float).max()
    low = points["accuracy"].min() if np.isnan(low) else low
    high = points["accuracy"].max() if np.isnan(high) else high
    return max(0.0, float(low) - 0.02), min(1.0, float(high) + 0.02) + 0.005


def _one_ar_per_engine(points: pd.DataFrame) -> pd.DataFrame:
    """Drop the baseline stage's ``ar · setdiff`` series where the bench measured our AR too:
    the same model on the same engine (its side-by-side numbers stay in the engines table)."""
    if "source" not in points or "series" not in points:
        return points
    own_ar = (points["paradigm"] == "ar") & (points["engine"] == "setdiff")
    bench_ar = own_ar & (points["source"] == "bench")
    if not bench_ar.any():
        return points
    return points[~(own_ar & (points["source"] != "bench"))]


def plot_quality_vs_throughput(points: pd.DataFrame) -> Figure:
    """Accuracy vs tokens/s per configuration, one Pareto front per paradigm / AR engine.

    Args:
        points: `stats.summarize_configs` output (optionally with a ``run`` column).
    """
    return _plot_quality_vs(points, "tokens_per_second")


def plot_quality_vs_tokens_per_forward(
    points: pd.DataFrame, lossless: pd.DataFrame | None = None
) -> Figure:
    """Accuracy vs tokens decoded per model forward (parallelism, independent of hardware).

    Args:
        points: as `plot_quality_vs_throughput`.
        lossless: the lossless stage's methods (`reports.inputs.run` rows: task, method, accuracy,
            n, tokens_per_forward), drawn as hollow diamonds where they decode more than one
            token per forward of the main model.
    """
    return _plot_quality_vs(points, "tokens_per_forward", lossless)


def plot_quality_vs_latency(points: pd.DataFrame) -> Figure:
    """Accuracy vs mean per-example latency; the front is lower-latency-and-more-accurate."""
    return _plot_quality_vs(points, "latency_s")


def plot_batched_throughput(batched: pd.DataFrame) -> Figure:
    """Tokens/s vs batch size per method (the throughput regime), one panel per task."""
    tasks = list(dict.fromkeys(batched["task"]))
    axes = _grid(1, len(tasks))
    for ax, task in zip(axes[0], tasks, strict=True):
        seen: dict[str, int] = {}
        for method, group in batched[batched["task"] == task].groupby("method", sort=False):
            group = group.sort_values("batch_size")
            paradigm = str(group["paradigm"].iloc[0])
            engine = "transformers" if "transformers" in str(method) else "setdiff"
            nth = seen[paradigm] = seen.get(paradigm, -1) + 1
            style = "--" if paradigm == "ar" else RUN_LINESTYLES[nth % len(RUN_LINESTYLES)]
            x, y = group["batch_size"], group["tokens_per_second"]
            ax.plot(
                x,
                y,
                linestyle=style,
                marker="os^Dv"[nth % 5],
                color=series_color(paradigm, engine),
                label=method,
                gid=f"batched:{task}:{method}",
            )
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens/s", title=task)
        ax.legend(fontsize=7)
    return axes[0, 0].figure


# --- ablations --------------------------------------------------------------------------------


def _short(value: float) -> str:
    """Heatmap cell text: 3 significant digits, no exponent below a million."""
    if pd.isna(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _level_key(value: object) -> tuple[int, float, str]:
    """Sort key of a knob level: words ("off") first, then numbers and "lo–hi" bins by value."""
    try:
        return (1, float(str(value).split("–")[0]), "")
    except ValueError:
        return (0, 0.0, str(value))


def _pivot(trials: pd.DataFrame, x: str, y: str | None, value: str) -> pd.DataFrame:
    frame = trials.assign(_y="all") if y is None else trials
    table = frame.pivot_table(index=y or "_y", columns=x, values=value, aggfunc="mean")
    rows = sorted(table.index, key=_level_key)
    return table.reindex(index=rows, columns=sorted(table.columns, key=_level_key))


def plot_ablation_heatmaps(
    trials: pd.DataFrame,
    x: str,
    y: str | None,
    values: Sequence[str] = ("accuracy", "tokens_per_second"),
) -> Figure:
    """Mean of each of `values` over completed trials on an (`x`, `y`) knob grid, per task.

    Args:
        trials: ablation trials (``state``, knob columns ``param_*``, metric columns, ``task``).
        x, y: knob columns for the heatmap axes (`y` None: one row).
    """
    if "state" in trials:
        trials = trials[trials["state"] == "COMPLETE"]
    tasks = _unique(trials, "task")
    axes = _grid(len(tasks), len(values), width=5.0, height=3.8)
    for row, task in enumerate(tasks):
        frame = trials[trials["task"] == task]
        for ax, value in zip(axes[row], values, strict=True):
            table = _pivot(frame, x, y, value)
            cmap = "viridis" if value == "accuracy" else "mako"
            bounds = {}  # colours span the data: a 0.80-0.94 grid stays readable
            sns.heatmap(
                table,
                annot=table.map(_short),
                fmt="",
                cmap=cmap,
                ax=ax,
                cbar_kws={"label": value},
                **bounds,
            )
            ax.collections[0].set_gid(f"heatmap:{task}:{value}")
            ax.set(xlabel=x.removeprefix("param_"), ylabel=(y or "").removeprefix("param_"))
            ax.set_title(f"{task}: mean {value}")
    return axes[0, 0].figure


TRIAL_X: dict[str, tuple[str, bool]] = {
    "tokens_per_second": ("tokens / s", True),
    "tokens_per_forward": ("tokens per forward", True),
    "nfe_mean": ("mean NFE per answer (lower is faster)", False),
}
"""Trial metric on the x axis -> (label, larger is better)."""


def _draw_study(ax: Axes, done: pd.DataFrame, x: str, gid: str) -> None:
    """Completed trials grey; Pareto-optimal ones in their paradigm's colour, joined by the
    staircase that bounds the dominated region."""
    larger = TRIAL_X[x][1]
    front = done["is_pareto"].astype(bool) if "is_pareto" in done else None
    if front is None:
        front = pareto_mask(done, x, larger_x=larger)
    rest, best = done[~front], done[front].sort_values(x)
    ax.scatter(
        rest[x].to_numpy(float),
        rest["accuracy"].to_numpy(float),
        color=MUTED_COLOR,
        s=18,
        label="trial",
        gid=f"trials:{gid}",
    )
    paradigms = best["paradigm"] if "paradigm" in best else pd.Series("setdlm", index=best.index)
    for paradigm in paradigm_order(paradigms):
        mine = best[paradigms == paradigm]
        ax.scatter(
            mine[x].to_numpy(float),
            mine["accuracy"].to_numpy(float),
            s=40,
            zorder=3,
            color=PARADIGM_COLORS.get(paradigm, MUTED_COLOR),
            label=f"Pareto-optimal ({paradigm})",
            gid=f"pareto:{gid}:{paradigm}",
        )
    ax.plot(
        best[x].to_numpy(float),
        best["accuracy"].to_numpy(float),
        color="black",
        linewidth=0.8,
        drawstyle="steps-pre" if larger else "steps-post",
        gid=f"pareto-line:{gid}",
        label="_front",
    )


def plot_optuna_pareto(trials: pd.DataFrame, x: str = "tokens_per_second") -> Figure:
    """Optuna trials in (`x`, accuracy), one panel per task (and study); the study's
    Pareto-optimal trials (``is_pareto``, else computed) highlighted by paradigm.

    Args:
        trials: ablation trials (task, state, accuracy, `x`[, is_pareto, paradigm, study]).
        x: the speed metric of the study's objectives (`TRIAL_X`).
    """
    keys = ["task", "study"] if "study" in trials else ["task"]
    groups = list(trials.groupby(keys, sort=False))
    axes = _grid(1, len(groups))
    for ax, (key, frame) in zip(axes[0], groups, strict=True):
        name = ":".join(str(k) for k in key)
        title = _study_title(str(key[0]), str(key[1]) if len(keys) == 2 else "")
        states = frame["state"].value_counts() if "state" in frame else pd.Series(dtype=int)
        done = frame[frame["state"] == "COMPLETE"] if "state" in frame else frame
        _draw_study(ax, done.dropna(subset=[x, "accuracy"]), x, name)
        counts = ", ".join(f"{n} {str(s).lower()}" for s, n in states.items())
        ax.set(xlabel=TRIAL_X[x][0], ylabel="accuracy", title=f"{title}: {counts or 'no trials'}")
        ax.legend(fontsize="small")
    return axes[0, 0].figure


def _study_title(task: str, study: str) -> str:
    """``arith-default-6e10f2c2`` (task, preset, hash of the search space) -> ``arith, default
    preset``: the reader's words, not the storage key."""
    middle = study.removeprefix(f"{task}-")
    preset, _, digest = middle.rpartition("-")
    if preset and len(digest) == 8 and all(c in "0123456789abcdef" for c in digest):
        return f"{task}, {preset} preset"
    return task if not study else f"{task}, {study}"


# --- decode traces ----------------------------------------------------------------------------


def _draw_set_sizes(
    ax: Axes,
    frame: pd.DataFrame,
    task: str,
    paradigm: str,
    per_forward: Mapping[tuple[str, str, str], float],
) -> None:
    """Dodged bars: share of forwards per set size, one shade of the paradigm per config; the
    legend gives each config's tokens per forward as the tables define it (`per_forward`: new
    tokens up to EOS over forwards), or the bars' own mean where the bench has none."""
    configs = _unique(frame, "config")
    colors = shades(PARADIGM_COLORS.get(paradigm, MUTED_COLOR), len(configs))
    width = 0.8 / len(configs)
    for j, config in enumerate(configs):
        values = frame.loc[frame["config"] == config, "set_size"]
        share = values.value_counts(normalize=True).sort_index()
        ax.bar(
            share.index.to_numpy(float) + (j - (len(configs) - 1) / 2) * width,
            share.to_numpy(),
            width=width,
            color=colors[j],
            label=_set_size_label(config, per_forward.get((task, paradigm, config)), values),
            gid=f"hist:{task}:{paradigm}:{config}",
        )
    sizes = sorted(frame["set_size"].unique())
    if len(sizes) <= 16:
        ax.set_xticks(sizes)
    ax.set_title(f"{task} · {paradigm}", color=PARADIGM_COLORS.get(paradigm, "black"))
    ax.set(xlabel="tokens accepted per forward", ylabel="share of forwards")
    ax.legend(fontsize="x-small")


def _set_size_label(config: object, tokens_per_forward: float | None, sizes: pd.Series) -> str:
    if tokens_per_forward is None or np.isnan(tokens_per_forward):
        return f"{config} (committed/forward {sizes.mean():.2f})"
    return f"{config} ({tokens_per_forward:.2f} tokens/forward)"


def plot_set_size_histogram(
    sizes: pd.DataFrame,
    per_forward: Mapping[tuple[str, str, str], float] | None = None,
    columns: int = 3,
) -> Figure:
    """Share of forwards accepting k tokens: a panel per (task, paradigm), `columns` per row,
    one bar shade per configuration (legend: config and its tokens per forward).

    Args:
        sizes: `stats.trace_set_sizes` output (task, paradigm, config, set_size).
        per_forward: (task, paradigm, config) -> tokens per forward of the bench summary, the
            one definition the tables and the other figures use (new tokens up to EOS over
            forwards; the bars also count what a forward commits after EOS).
    """
    panels = [
        (task, paradigm, frame)
        for task in _unique(sizes, "task")
        for paradigm in paradigm_order(sizes["paradigm"])
        if len(frame := sizes[(sizes["task"] == task) & (sizes["paradigm"] == paradigm)])
    ]
    columns = min(columns, len(panels))
    axes = _grid(-(-len(panels) // columns), columns, width=4.2, height=3.2).ravel()
    for ax, (task, paradigm, frame) in zip(axes, panels, strict=False):
        _draw_set_sizes(ax, frame, task, paradigm, per_forward or {})
    for ax in axes[len(panels) :]:
        ax.remove()
    return axes[0].figure


def _plot_per_config(orders: pd.DataFrame, value: str, xlabel: str, reference: float) -> Figure:
    """Per (paradigm, config): a box of `value` over examples and one dot per example."""
    tasks = _unique(orders, "task")
    n_rows = orders.groupby(["paradigm", "config"]).ngroups
    axes = _grid(1, len(tasks), width=6.5, height=max(2.5, 0.45 * n_rows + 1.2))
    rng = np.random.default_rng(0)  # fixed jitter: identical figures for identical inputs
    for ax, task in zip(axes[0], tasks, strict=True):
        frame = orders[orders["task"] == task]
        groups = list(frame.groupby(["paradigm", "config"], sort=False))
        for i, ((paradigm, config), group) in enumerate(groups):
            color = PARADIGM_COLORS.get(str(paradigm), MUTED_COLOR)
            values = group[value].dropna().to_numpy(float)
            if values.size:
                box = ax.boxplot(
                    [values],
                    positions=[i],
                    orientation="horizontal",
                    widths=0.6,
                    showfliers=False,
                    patch_artist=True,
                )
                box["boxes"][0].set(facecolor=color, alpha=0.25, edgecolor=color)
                box["medians"][0].set(color="black")
            jitter = rng.uniform(-0.18, 0.18, size=values.size)
            ax.scatter(
                values,
                i + jitter,
                s=10,
                color=color,
                alpha=0.8,
                gid=f"{value}:{task}:{paradigm}:{config}",
            )
        ax.set_yticks(range(len(groups)), [f"{p} · {c}" for (p, c), _ in groups], fontsize=8)
        ax.axvline(reference, color="black", linewidth=0.8, linestyle=":")
        ax.set(xlabel=xlabel, title=str(task))
        ax.invert_yaxis()
        present = paradigm_order(frame["paradigm"])
        handles = [Patch(color=PARADIGM_COLORS.get(p, MUTED_COLOR), label=p) for p in present]
        ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return axes[0, 0].figure


def plot_kendall_tau(orders: pd.DataFrame) -> Figure:
    """Kendall's tau-b of decode order vs left-to-right, per example (1 = strictly left-to-right).

    Args:
        orders: `stats.trace_orders` output (task, paradigm, config, kendall_tau).
    """
    return _plot_per_config(orders, "kendall_tau", "Kendall's tau vs left-to-right order", 1.0)


def plot_frontier_distance(orders: pd.DataFrame) -> Figure:
    """Window occupancy: mean distance of decoded positions from the left-to-right frontier."""
    label = "mean distance of decoded positions from the frontier (tokens; 0 = AR)"
    return _plot_per_config(orders, "frontier_distance", label, 0.0)


# --- training ---------------------------------------------------------------------------------


def plot_training_curves(log: pd.DataFrame, starts: dict[str, float] | None = None) -> Figure:
    """Train loss, eval loss and (when logged) answer accuracy vs step, one line per paradigm
    (and run), one row per task.

    Args:
        log: train logs (task, paradigm, step, train_loss, eval_loss[, accuracy][, run]).
        starts: per task, the step the diffusion fine-tunes start from (the AR model's last
            step when they are initialised from it): their curves are drawn after it, with a
            dotted line where the fine-tunes begin.
    """
    starts = starts or {}
    tasks = _unique(log, "task")
    metrics = [m for m in ("train_loss", "eval_loss", "accuracy") if m in log]
    axes = _grid(len(tasks), len(metrics), width=5.5, height=3.6)
    fig = axes[0, 0].figure
    for row, task in enumerate(tasks):
        for ax, metric in zip(axes[row], metrics, strict=True):
            if log.loc[log["task"] == task, metric].isna().all():
                ax.remove()  # e.g. a task that logs no accuracy: no empty panel
                continue
            for run_index, run, frame in _runs(log[log["task"] == task]):
                for paradigm in paradigm_order(frame["paradigm"]):
                    curve = frame[frame["paradigm"] == paradigm].dropna(subset=[metric])
                    curve = curve.sort_values("step")
                    name = _label(paradigm, run)
                    offset = 0.0 if paradigm == "ar" else starts.get(str(task), 0.0)
                    ax.plot(
                        curve["step"].to_numpy(float) + offset,
                        curve[metric].to_numpy(float),
                        marker=".",
                        label=name,
                        color=PARADIGM_COLORS.get(paradigm, MUTED_COLOR),
                        linestyle=RUN_LINESTYLES[run_index % len(RUN_LINESTYLES)],
                        gid=f"{metric}:{task}:{name}",
                    )
            if starts.get(str(task)):
                start = starts[str(task)]
                ax.axvline(start, color=MUTED_COLOR, linestyle=":", gid=f"fine_tune_start:{task}")
            ax.set(xlabel="step", ylabel=metric.replace("_", " "), title=f"{task}: {metric}")
            ax.legend(fontsize="small")
    return fig
