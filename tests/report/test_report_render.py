"""reports.render: figures checked for content (the plotted data equals the summary tables, every
paradigm in the legend) and tables checked cell by cell, on the synthetic run of `report_run`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from metrics_records import BATCHED

from report.report_run import PARADIGMS, by_gid, legend_labels
from reports import items
from reports.analysis import stats
from reports.items import Derived
from reports.render import figures, tables
from reports.render.style import PARADIGM_COLORS


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


@pytest.mark.parametrize("x", ["tokens_per_second", "tokens_per_forward", "latency_s"])
def test_quality_figures_plot_the_summary(derived: Derived, x: str) -> None:
    make = {
        "tokens_per_second": figures.plot_quality_vs_throughput,
        "tokens_per_forward": figures.plot_quality_vs_tokens_per_forward,
        "latency_s": figures.plot_quality_vs_latency,
    }[x]
    points = derived.points
    ax = make(points).axes[0]
    dots, fronts = by_gid(ax.lines, "points:arith:"), by_gid(ax.lines, "frontier:arith:")
    bars = by_gid(ax.collections, "ci:arith:")
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
        front = group[stats.pareto_mask(group, x, larger_x=x != "latency_s")]
        np.testing.assert_allclose(fronts[series].get_xdata(), front[x])
        np.testing.assert_allclose(fronts[series].get_ydata(), front["accuracy"])
    legend = legend_labels(ax)
    assert set(PARADIGMS) <= set(legend)
    assert {"ar · vllm", "ar · transformers", "ar · vllm (throughput)"} <= set(legend)
    # Only the task's overall Pareto front is labelled (series of one point carry no label).
    front = plotted[stats.pareto_mask(plotted, x, larger_x=x != "latency_s")]
    sizes = plotted["series"].map(plotted["series"].value_counts())
    front = front[sizes.loc[front.index] > 1]
    expected = sorted(figures._short_config(c) for c in front["config"])
    assert sorted(t.get_text() for t in ax.texts) == expected
    assert not any("threshold=" in t.get_text() for t in ax.texts)


def test_lossless_methods_are_drawn_on_the_tokens_per_forward_figure(derived: Derived) -> None:
    lossless = derived.run.lossless
    ax = figures.plot_quality_vs_tokens_per_forward(derived.points, lossless).axes[0]
    drawn = by_gid(ax.lines, "lossless:arith:")
    # The speculative ones; the plain decodes (1 token per forward) are the bench's points.
    assert set(drawn) == {"ar+draft k=2", "setdlm verify W=8"}
    verify = lossless[lossless["method"] == "setdlm verify W=8"].iloc[0]
    assert drawn["setdlm verify W=8"].get_xdata()[0] == pytest.approx(verify["tokens_per_forward"])
    assert drawn["setdlm verify W=8"].get_ydata()[0] == pytest.approx(verify["accuracy"])
    assert drawn["setdlm verify W=8"].get_color() == PARADIGM_COLORS["setdlm"]
    assert {"ar+draft k=2 (lossless)", "setdlm verify W=8 (lossless)"} <= set(legend_labels(ax))
    plain = figures.plot_quality_vs_tokens_per_forward(derived.points).axes[0]
    assert not by_gid(plain.lines, "lossless:")


def test_labels_that_would_overprint_are_hidden_in_drawing_order() -> None:
    ax = Figure(figsize=(4, 3), layout="constrained").subplots()
    ax.set(xlim=(0, 10), ylim=(0, 1))
    first = ax.annotate("threshold 0.9", (5.0, 0.5), fontsize=7)
    close = ax.annotate("threshold 0.8", (5.1, 0.51), fontsize=7)  # overprints the first
    far = ax.annotate("W8", (1.0, 0.1), fontsize=7)
    assert figures.hide_overprinted_labels(ax) == ["threshold 0.8"]
    assert first.get_visible() and far.get_visible() and not close.get_visible()
    assert figures._short_config("verify=True window=8") == "verify W8"


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
    dots = by_gid(ax.lines, "points:arith:")
    for paradigm in PARADIGMS:
        assert dots[paradigm].get_color() == PARADIGM_COLORS[paradigm]
    assert dots["ar · vllm"].get_color() != PARADIGM_COLORS["ar"]


def test_ablation_heatmap_cells_are_trial_means(derived: Derived) -> None:
    trials = derived.run.trials
    fig = figures.plot_ablation_heatmaps(trials, "param_set_size", "param_window")
    done = trials[trials["state"] == "COMPLETE"]
    meshes = by_gid([c for ax in fig.axes for c in ax.collections], "heatmap:arith:")
    for value in ("accuracy", "tokens_per_second"):
        mesh = meshes[value]
        expected = done.pivot_table(index="param_window", columns="param_set_size", values=value)
        np.testing.assert_allclose(
            np.asarray(mesh.get_array()).ravel(), expected.to_numpy().ravel()
        )


def test_optuna_pareto_highlights_pareto_trials(derived: Derived) -> None:
    trials = derived.run.trials
    ax = figures.plot_optuna_pareto(trials).axes[0]
    best = by_gid(ax.collections, "pareto:arith:")["setdlm"].get_offsets()
    expected = trials[trials["is_pareto"]][["tokens_per_second", "accuracy"]]
    assert sorted(map(tuple, best)) == sorted(map(tuple, expected.to_numpy()))
    rest = by_gid(ax.collections, "trials:")["arith"].get_offsets()
    assert len(rest) == (trials["state"] == "COMPLETE").sum() - len(expected)
    assert "4 pruned" in ax.get_title()


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
    dots = by_gid(ax.collections, f"{value}:arith:")
    assert len(dots) == orders.groupby(["paradigm", "config"]).ngroups
    for (paradigm, config), group in orders.groupby(["paradigm", "config"]):
        xs = dots[f"{paradigm}:{config}"].get_offsets()[:, 0]
        np.testing.assert_allclose(np.sort(xs), np.sort(group[value].dropna()))
    assert set(legend_labels(ax)) == set(PARADIGMS)
    if value == "kendall_tau":
        np.testing.assert_allclose(dots["ar:default"].get_offsets()[:, 0], 1.0)


def test_training_curves_match_logs(derived: Derived) -> None:
    log = derived.run.train_log
    fig = figures.plot_training_curves(log)
    assert len(fig.axes) == 4  # 2 tasks x (train, eval)
    lines = by_gid([line for ax in fig.axes for line in ax.lines], "")
    for (task, paradigm), group in log.groupby(["task", "paradigm"]):
        for metric in ("train_loss", "eval_loss"):
            line = lines[f"{metric}:{task}:{paradigm}"]
            np.testing.assert_allclose(line.get_ydata(), group.sort_values("step")[metric])
    for ax in fig.axes:
        assert legend_labels(ax) == list(PARADIGMS)


def test_a_logged_accuracy_gets_its_own_column(derived: Derived) -> None:
    log = derived.run.train_log.copy()
    arith = log["task"] == "arith"
    log.loc[arith, "accuracy"] = log.loc[arith, "step"] / 100
    fig = figures.plot_training_curves(log)
    assert len(fig.axes) == 5  # 2 tasks x (train, eval) + arith's accuracy
    lines = by_gid([line for ax in fig.axes for line in ax.lines], "")
    for paradigm, group in log[arith].groupby("paradigm"):
        line = lines[f"accuracy:arith:{paradigm}"]
        np.testing.assert_allclose(line.get_ydata(), group.sort_values("step")["accuracy"])
    assert "accuracy:text:ar" not in lines  # text logs no accuracy: no empty panel
    assert "text: accuracy" not in [ax.get_title() for ax in fig.axes]


def test_fine_tunes_are_drawn_after_the_ar_steps_they_start_from(derived: Derived) -> None:
    log = derived.run.train_log
    starts = items.fine_tune_starts(derived.run)
    assert starts == {"arith": 40.0, "text": 40.0}  # no params: init_from_ar defaults to true
    lines = by_gid(
        [ln for ax in figures.plot_training_curves(log, starts).axes for ln in ax.lines], ""
    )
    ar_steps = log[(log["task"] == "arith") & (log["paradigm"] == "ar")]["step"].sort_values()
    np.testing.assert_allclose(lines["eval_loss:arith:ar"].get_xdata(), ar_steps)
    np.testing.assert_allclose(lines["eval_loss:arith:setdlm"].get_xdata(), ar_steps + 40)
    run = dataclasses.replace(derived.run, params={"train": {"arith": {"init_from_ar": False}}})
    assert items.fine_tune_starts(run) == {"text": 40.0}


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
