""" "What this run shows": a few sentences computed from a run's numbers (pure, no I/O).

Each sentence states one comparison with its uncertainty: answer accuracy per paradigm with a
95% Wilson interval and the gap to AR in points; the headline speedup at matched accuracy with
its bootstrap CI (from the tradeoff stage); the set-size study's accuracies; the best backbone
of the backbone study. Nothing is said about an input the run does not have.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.analysis.stats import sort_paradigms, wilson_interval


def accuracy_sentences(evaluate: pd.DataFrame) -> list[str]:
    """Per answer task: every paradigm's accuracy [95% CI] and its gap to AR."""
    if evaluate.empty or "accuracy" not in evaluate:
        return []
    out = []
    for task, frame in sort_paradigms(evaluate.dropna(subset=["accuracy"])).groupby(
        "task", sort=False
    ):
        acc = dict(zip(frame["paradigm"], frame["accuracy"].astype(float), strict=True))
        n = dict(zip(frame["paradigm"], frame.get("n_answers", 0), strict=True))
        parts = []
        for paradigm, value in acc.items():
            lo, hi = wilson_interval(value, int(n.get(paradigm) or 0))
            gap = (
                ""
                if paradigm == "ar" or "ar" not in acc
                else f", {100 * (value - acc['ar']):+.1f} pts vs ar"
            )
            parts.append(f"{paradigm} {value:.3f} [{lo:.3f}, {hi:.3f}]{gap}")
        counts = sorted({int(v) for v in n.values() if v})
        prompts = f" ({'/'.join(map(str, counts))} test prompts, greedy)" if counts else ""
        out.append(f"Answer accuracy on {task}{prompts}: " + "; ".join(parts) + ".")
    return out


def speedup_sentences(
    comparisons: pd.DataFrame, fingerprints: pd.DataFrame | None = None
) -> list[str]:
    """The headline: setdlm over our AR decoder within the tolerance of AR's accuracy, with its
    CI, both test accuracies and the regime (batch 1, the bench's threads and device)."""
    if comparisons.empty or "comparison" not in comparisons:
        return []
    out = []
    for _, row in comparisons[comparisons["comparison"] == "setdlm vs ar"].iterrows():
        missing = row.get("missing")
        if isinstance(missing, str) and missing:
            out.append(f"setdlm vs ar on {row['task']}: no speedup reported ({missing}).")
            continue
        lo, hi = row.get("ci_lo"), row.get("ci_hi")
        ci = "" if pd.isna(lo) or pd.isna(hi) else f" [95% CI {lo:.2f}–{hi:.2f}]"
        matched = row.get("matched") if isinstance(row.get("matched"), str) else "matched"
        accuracy = float(row.get("method_accuracy", math.nan))
        ar = float(row.get("baseline_accuracy", math.nan))
        out.append(
            f"setdlm decodes {row['speedup']:.2f}×{ci} as many tokens/s as AR on {row['task']} "
            f"{_regime(fingerprints, row['task'])}({matched}; setdlm {row.get('method_config')}, "
            f"accuracy {accuracy:.3f} against AR's {ar:.3f})."
        )
    return out


def _regime(fingerprints: pd.DataFrame | None, task: str) -> str:
    """``at batch 1, 1 thread, cpu `` from the bench fingerprint of `task` (batch 1 always)."""
    if fingerprints is None or fingerprints.empty:
        return "at batch 1 "
    mine = fingerprints[fingerprints["task"] == task].set_index("key")["value"]
    threads, device = mine.get("threads"), mine.get("device_name") or mine.get("device")
    parts = ["batch 1"]
    if threads is not None and not pd.isna(threads):
        parts.append(f"{threads} thread{'s' if str(threads) != '1' else ''}")
    if device is not None and not pd.isna(device):
        parts.append(str(device))
    return "at " + ", ".join(parts) + " "


def backbone_sentences(backbone: pd.DataFrame) -> list[str]:
    """The backbone variant with the smallest setdlm gap to its own AR, per task and D."""
    if backbone.empty or "ar" not in backbone:
        return []
    out = []
    gaps = [c for c in backbone.columns if c.startswith("setdlm_d") and c.count("_") == 1]
    for task, frame in backbone.groupby("task", sort=False):
        for column in gaps:
            gap = 100 * (frame[column].astype(float) - frame["ar"].astype(float))
            if gap.dropna().empty:
                continue
            best, worst = frame.loc[gap.idxmax()], frame.loc[gap.idxmin()]
            d = column.removeprefix("setdlm_d")
            out.append(
                f"Backbone study on {task}, D = {d}: setdlm comes closest to its AR with "
                f"`{best['variant']}` ({gap.max():+.1f} pts; AR {best['ar']:.3f}) and falls "
                f"furthest behind with `{worst['variant']}` ({gap.min():+.1f} pts)."
            )
    return out


def setsize_sentences(setsize: pd.DataFrame, evaluate: pd.DataFrame) -> list[str]:
    """Per task and paradigm of the set-size study: each D's accuracy [95% CI] and gap to AR."""
    if setsize.empty or "accuracy" not in setsize:
        return []
    ar = {}
    if not evaluate.empty and "accuracy" in evaluate:
        ar = {r.task: r.accuracy for r in evaluate.itertuples() if r.paradigm == "ar"}
    out = []
    for (task, paradigm), frame in sort_paradigms(setsize, then=("set_size",)).groupby(
        ["task", "paradigm"], sort=False
    ):
        parts = []
        for row in frame.to_dict("records"):
            accuracy = float(row["accuracy"])
            lo, hi = wilson_interval(accuracy, int(row["n_examples"]))
            gap = "" if task not in ar else f", {100 * (accuracy - ar[task]):+.1f} pts vs ar"
            window = row.get("window")
            what = f"D = {row['set_size']:.0f}"
            what += "" if window is None or window != window else f", W = {window:.0f}"
            what += f" ({row['model']})" if isinstance(row.get("model"), str) else ""
            parts.append(f"{what}: {accuracy:.3f} [{lo:.3f}, {hi:.3f}]{gap}")
        out.append(f"{paradigm} at other set sizes on {task}: " + "; ".join(parts) + ".")
    return out


def findings(
    evaluate: pd.DataFrame,
    comparisons: pd.DataFrame,
    backbone: pd.DataFrame,
    setsize: pd.DataFrame,
    fingerprints: pd.DataFrame | None = None,
) -> list[str]:
    """Every sentence of the report's opening paragraph, in reading order."""
    return (
        accuracy_sentences(evaluate)
        + setsize_sentences(setsize, evaluate)
        + speedup_sentences(comparisons, fingerprints)
        + backbone_sentences(backbone)
    )
