"""One function per table: tidy frame in, display frame out (formatted strings, ready to render).

Numbers are formatted here, once, so the Markdown and HTML reports show the same text. Empty
input gives an empty frame; the caller decides what to say about it.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from reports.analysis.stats import (
    accuracy_under_parallelism,
    bootstrap_mean_ci,
    pareto_mask,
    sd_interval,
    sort_paradigms,
    wilson_interval,
)
from reports.inputs.missing import Missing

TEXTGEN_FIRST = (
    "infill_rouge_l",
    "infill_exact",
    "gen_ppl",
    "uncond_gen_ppl",
    "unigram_entropy",
    "uncond_unigram_entropy",
    "distinct_1",
    "distinct_2",
    "distinct_3",
    "uncond_distinct_1",
    "uncond_distinct_2",
    "uncond_distinct_3",
)
"""Text-generation metrics shown first, in this order; other numeric keys follow, sorted."""


def fmt(value: object, spec: str = ".3g") -> str:
    """A number formatted with `spec`; blank for None/NaN; other values as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def fmt_ci(value: float, low: float, high: float, spec: str = ".3f") -> str:
    """``0.850 [0.700, 0.950]``; the CI is left out when unknown."""
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high)):
        return fmt(value, spec)
    return f"{fmt(value, spec)} [{fmt(low, spec)}, {fmt(high, spec)}]"


def best_config_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per task and series (paradigm / AR engine): the most accurate configuration, fastest first
    among ties, with accuracy [95% bootstrap CI], tokens/s, NFE, tokens/forward and memory."""
    if points.empty:
        return pd.DataFrame()
    ranked = points.sort_values(["accuracy", "tokens_per_second"], ascending=False, kind="stable")
    best = ranked.groupby(["task", "series"], sort=False).head(1)
    best = sort_paradigms(best, then=("engine", "series"))
    return pd.DataFrame(
        {
            "task": best["task"],
            "paradigm": best["series"],
            "best config": best["config"],
            "accuracy [95% CI]": [
                fmt_ci(a, lo, hi)
                for a, lo, hi in zip(
                    best["accuracy"], best["accuracy_lo"], best["accuracy_hi"], strict=True
                )
            ],
            "tokens/s": best["tokens_per_second"].map(lambda v: fmt(v, ",.1f")),
            "NFE": best["nfe"].map(lambda v: fmt(v, ".1f")),
            "tokens/forward": best["tokens_per_forward"].map(lambda v: fmt(v, ".2f")),
            "latency (ms)": (best["latency_s"] * 1e3).map(lambda v: fmt(v, ".1f")),
            "peak mem (MB)": best["peak_mem_mb"].map(lambda v: fmt(v, ",.0f")),
            "n": best["n"].map(lambda v: fmt(v, ".0f")),
        }
    )


def engines_table(engines: pd.DataFrame, throughput: pd.DataFrame) -> pd.DataFrame:
    """Baseline engines per task: ran or not (and why), aggregate tokens/s per batch size (our
    AR and transformers) or concurrency (vLLM)."""
    if engines.empty:
        return pd.DataFrame()
    rates = {}
    for (task, engine), group in throughput.groupby(["task", "engine"]) if len(throughput) else []:
        pairs = group.sort_values("concurrency")[["concurrency", "tokens_per_second"]]
        items = zip(pairs["concurrency"], pairs["tokens_per_second"], strict=True)
        rates[(task, engine)] = ", ".join(f"×{int(c)}: {fmt(r, ',.1f')}" for c, r in items)
    return pd.DataFrame(
        {
            "task": engines["task"],
            "engine": engines["engine"],
            "status": engines["status"],
            "detail": engines["detail"].map(fmt),
            "aggregate tokens/s by batch size (vLLM: concurrency)": [
                rates.get((t, e), "")
                for t, e in zip(engines["task"], engines["engine"], strict=True)
            ],
        }
    )


def batched_table(batched: pd.DataFrame) -> pd.DataFrame:
    """Throughput regime: tokens/s per method at each batch size (3 significant figures) with its
    ratio to the fastest AR engine there (ours or transformers', when the sweep ran both; else to
    our batched AR), accuracy, and the crossover: the smallest batch size where the ratio falls
    below 1, against the best engine and against each."""
    if batched.empty:
        return pd.DataFrame()
    out = []
    for (task, method), group in batched.groupby(["task", "method"], sort=False):
        group = group.sort_values("batch_size")
        row: dict[str, str] = {"task": task, "method": method}
        best = "best_ar_ratio" in group and group["best_ar_ratio"].notna().any()
        for _, cell in group.iterrows():
            ratio = cell.get("best_ar_ratio") if best else cell.get("speedup_vs_ar")
            beside = "" if _blank(ratio) else f" ({ratio:.2f}×)"
            row[f"B={int(cell['batch_size'])}"] = fmt_rate(cell["tokens_per_second"]) + beside
        row["accuracy"] = fmt(group["accuracy"].iloc[0], ".3f")
        same = group.get("identical_to_batch1")
        row["rows = batch 1"] = "" if same is None else ("yes" if same.dropna().all() else "no")
        if group["paradigm"].iloc[0] != "ar":
            row.update(_crossover(group, best))
        out.append(row)
    return pd.DataFrame(out).fillna("")


def _crossover(group: pd.DataFrame, best: bool) -> dict[str, str]:
    """Where a method stops beating AR: against the best engine and each (``best``), or else
    the largest batch size at which it still beats our batched AR."""
    row: dict[str, str] = {}
    if best:
        last = f"none up to B={int(group['batch_size'].max())}"
        crossover = group["crossover"].iloc[0]
        row["crossover (best AR)"] = last if _blank(crossover) else f"B={int(crossover)}"
        per_engine = group["crossover_vs"].iloc[0] or {}
        row["crossover per AR engine"] = "; ".join(
            f"{engine} {'none' if _blank(b) else f'B={int(b)}'}"
            for engine, b in sorted(per_engine.items())
        )
    else:
        beats = group[group["speedup_vs_ar"].astype(float) > 1]["batch_size"]
        row["beats batched AR up to"] = f"B={int(beats.max())}" if len(beats) else "never"
    return row


def fmt_rate(value: object) -> str:
    """A rate at 3 significant figures with thousands separators: ``8,410``, ``96.3``."""
    if _blank(value) or not isinstance(value, int | float):
        return fmt(value)
    rounded = float(f"{float(value):.3g}")
    return f"{rounded:,.0f}" if abs(rounded) >= 100 else f"{rounded:.3g}"


def _side(row: pd.Series, prefix: str) -> str:
    config = row.get(f"{prefix}_config")
    if config is None or (isinstance(config, float) and math.isnan(config)):
        return ""
    engine = row.get(f"{prefix}_engine")
    where = "" if engine in (None, "setdiff") or pd.isna(engine) else f" [{engine}]"
    acc, rate = row.get(f"{prefix}_accuracy"), row.get(f"{prefix}_tokens_per_second")
    return f"{config}{where}: acc {fmt(acc, '.3f')}, {fmt(rate, ',.0f')} tok/s"


def speedup_table(comparisons: pd.DataFrame) -> pd.DataFrame:
    """Speedup at matched accuracy (from metrics/tradeoff) with its CI; missing ones say why."""
    if comparisons.empty:
        return pd.DataFrame()
    records = []
    for _, row in comparisons.iterrows():
        missing = row.get("missing")
        if isinstance(missing, str) and missing:
            speedup = f"missing: {missing}"
        else:
            speedup = f"{fmt_ci(row.get('speedup'), row.get('ci_lo'), row.get('ci_hi'), '.2f')}×"
        diff = row.get("accuracy_diff")
        dominates = row.get("dominates")
        records.append(
            {
                "task": row["task"],
                "comparison": row["comparison"],
                "speedup [95% CI]": speedup,
                "matched at": fmt(row.get("matched")),
                "method config": _side(row, "method"),
                "baseline config": _side(row, "baseline"),
                "accuracy diff, test [95% CI]": ""
                if _blank(diff)
                else fmt_ci(diff, row.get("diff_lo"), row.get("diff_hi"), "+.3f"),
                "dominates": "" if _blank(dominates) else ("yes" if dominates else "no"),
            }
        )
    return pd.DataFrame(records)


def likelihood_table(evaluate: pd.DataFrame) -> pd.DataFrame:
    """Perplexity per task and paradigm; bounds (ELBO-based) are marked ``≤``, exact ones ``=``."""
    if evaluate.empty or "ppl" not in evaluate:
        return pd.DataFrame()
    frame = sort_paradigms(evaluate)
    exact = frame.get("likelihood_is_exact", pd.Series(False, index=frame.index)).fillna(False)
    table = pd.DataFrame(
        {
            "task": frame["task"],
            "paradigm": frame["paradigm"],
            "PPL": [
                f"{'=' if bool(e) else '≤'} {fmt(p, '.3f')}"
                for e, p in zip(exact, frame["ppl"], strict=True)
            ],
            "NLL / token": frame["nll_per_token"].map(lambda v: fmt(v, ".4f")),
            "likelihood": exact.map(lambda e: "exact" if bool(e) else "bound (NELBO)"),
            "tokens": frame.get("n_tokens", pd.Series(index=frame.index)).map(
                lambda v: fmt(v, ",.0f")
            ),
        }
    )
    if "accuracy" in frame:
        table["answer accuracy"] = frame["accuracy"].map(lambda v: fmt(v, ".3f"))
    return table


def _textgen_keys(frame: pd.DataFrame) -> list[str]:
    numeric = [
        c
        for c in frame.columns
        if c not in ("task", "paradigm")
        and "." not in c  # nested blocks (fingerprint, decode options) are not results
        and pd.api.types.is_numeric_dtype(frame[c])
        and not pd.api.types.is_bool_dtype(frame[c])
    ]
    first = [k for k in TEXTGEN_FIRST if k in numeric]
    return first + sorted(set(numeric) - set(first))


def textgen_table(textgen: pd.DataFrame, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Text generation metrics: one row per numeric key (all of them), one column per
    (task, paradigm); infill ROUGE-L gets a 95% bootstrap CI from the per-example rows."""
    if textgen.empty:
        return pd.DataFrame()
    frame = sort_paradigms(textgen)
    keys = _textgen_keys(frame)
    columns = {f"{r.task} · {r.paradigm}": r for r in frame.itertuples(index=False)}
    table = pd.DataFrame(
        {name: [fmt(getattr(r, k), ".4g") for k in keys] for name, r in columns.items()},
        index=keys,
    )
    if rows is not None and not rows.empty and "infill_rouge_l" in keys:
        for name, r in columns.items():
            mask = (rows["task"] == r.task) & (rows["paradigm"] == r.paradigm)
            scores = rows.loc[mask & (rows["config"] == "infill"), "score"].to_numpy(float)
            if scores.size:
                low, high = bootstrap_mean_ci(scores)
                table.loc["infill_rouge_l", name] = fmt_ci(r.infill_rouge_l, low, high, ".4g")
    return table.rename_axis("metric").reset_index()


def training_table(train: pd.DataFrame) -> pd.DataFrame:
    """Per task and paradigm: steps, final train/eval loss, wall time, parameters."""
    if train.empty:
        return pd.DataFrame()
    frame = sort_paradigms(train)
    columns = {
        "steps": ("steps", ".0f"),
        "final train loss": ("final_train_loss", ".4f"),
        "final eval loss": ("final_eval_loss", ".4f"),
        "seconds": ("seconds", ".1f"),
        "parameters": ("parameters", ",.0f"),
        "resumed from": ("resumed_from", ".0f"),
    }
    table = frame[["task", "paradigm"]].copy()
    for title, (key, spec) in columns.items():
        if key in frame:
            table[title] = frame[key].map(lambda v, s=spec: fmt(v, s))
    return table


def lmeval_table(lmeval: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, engine): lm-eval's exact match beside the evaluate stage's scorer on
    the same prompts, with how many decoded texts and verdicts agree; skipped engines say why."""
    if lmeval.empty:
        return pd.DataFrame()
    rows = []
    for _, r in lmeval.iterrows():
        ran = r.get("status") == "ran"
        n = r.get("n") if ran else None
        rows.append(
            {
                "task": r["task"],
                "engine": _lmeval_engine(str(r["engine"])),
                "lm-eval accuracy": fmt(r.get("lmeval_accuracy"), ".3f") if ran else "",
                "setdiff accuracy": fmt(r.get("setdiff_accuracy"), ".3f") if ran else "",
                "same text": f"{r.get('same_text'):.0f}/{n:.0f}" if ran else "",
                "same verdict": f"{r.get('same_verdict'):.0f}/{n:.0f}" if ran else "",
                "status": "ran" if ran else f"{r.get('status')}: {r.get('reason', '')}",
            }
        )
    return pd.DataFrame(rows)


def _lmeval_engine(engine: str) -> str:
    return "ar · vLLM (local-completions)" if engine == "vllm" else f"{engine} · setdiff"


def backbone_table(backbone: pd.DataFrame) -> pd.DataFrame:
    """One row per variant: AR and setdlm accuracy [95% Wilson interval], the gap to AR per D."""
    if backbone.empty:
        return pd.DataFrame()
    accuracy = [c for c in backbone.columns if c == "ar" or _is_setdlm_accuracy(c)]
    table = backbone[["task", "variant"]].copy()
    if "parameters" in backbone:
        table["parameters"] = backbone["parameters"].map(lambda v: fmt(v, ",.0f"))
    n = backbone["n_examples"].astype(float)
    for column in accuracy:
        acc = backbone[column].astype(float)
        table[_accuracy_title(column)] = [
            "not run yet" if math.isnan(a) else fmt_accuracy(a, m)
            for a, m in zip(acc, n, strict=True)
        ]
        if column != "ar" and not column.endswith("_w1"):
            gap = 100 * (acc - backbone["ar"].astype(float))
            table[f"gap {column.removeprefix('setdlm_')} (pts)"] = gap.map(
                lambda v: "" if math.isnan(v) else f"{v:+.1f}"
            )
    return table


def seeds_table(
    seeds: pd.DataFrame, evaluate: pd.DataFrame, train: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (task, paradigm) of the seed study, plus one per extra decode (``also``):
    each seed's accuracy, mean ± sample sd, the sd's 95% interval (chi-square: three seeds pin
    an sd only loosely), min–max, one run's binomial SE at the same prompts,
    tokens per forward (mean over seeds), the gap to the same seed's AR model on every seed and
    whether its sign holds on all of them, and the main run's accuracy (the recipe's seed, from
    the evaluate stage) when the study trained with the steps of the main run's model (`train`,
    ``metrics/train``; without it, the recipe's steps when the study ran)."""
    if seeds.empty:
        return pd.DataFrame()
    main = {}
    if not evaluate.empty and "accuracy" in evaluate:
        main = {(r.task, r.paradigm): r.accuracy for r in evaluate.itertuples()}
    trained = main_run_steps(train)
    records = sort_paradigms(seeds).to_dict("records")
    ar = {
        r["task"]: dict(zip(r.get("seeds") or [], r.get("accuracies") or [], strict=False))
        for r in records
        if r["paradigm"] == "ar"
    }
    rows = []
    for r in records:
        steps = trained.get((r["task"], r["paradigm"]), r.get("recipe_steps"))
        own = main.get((r["task"], r["paradigm"])) if r.get("steps") == steps else None
        spreads = [(r["paradigm"], r)]
        also = r.get("also")
        if isinstance(also, dict) and also.get("accuracies"):
            spreads.append((f"{r['paradigm']} {_decode_label(also.get('decode'))}", also))
        for label, spread in spreads:
            rows.append(
                {
                    "task": r["task"],
                    "paradigm": label,
                    "seeds": _seed_labels(r),
                    **_spread_cells(
                        spread,
                        r.get("seeds") or [],
                        None if label == "ar" else ar.get(r["task"]),
                    ),
                    "steps": fmt(r.get("steps"), ".0f"),
                    "main run": ""
                    if _blank(own) or spread is not r
                    else f"{own:.3f} (seed {fmt(r.get('recipe_seed'), '.0f')})",
                }
            )
    return pd.DataFrame(rows)


def _seed_labels(row: dict[str, Any]) -> str:
    """``0 (main run), 1, 2``: the seeds, marking those whose model is the main run's (the
    recipe's seed: scored by the study, trained by the train stage)."""
    ran = row.get("from_main_run")
    main = set(ran) if isinstance(ran, list) else set()
    return ", ".join(
        fmt(s, ".0f") + (" (main run)" if s in main else "") for s in row.get("seeds") or []
    )


def main_run_steps(train: pd.DataFrame | None) -> dict[tuple[str, str], int]:
    """The steps each main-run model trained (``metrics/train``), by (task, paradigm): a seeds
    row describes the main run's model only when it trained as many."""
    if train is None or train.empty or "steps" not in train:
        return {}
    return {(r.task, r.paradigm): int(r.steps) for r in train.itertuples() if not _blank(r.steps)}


SEED_SD_LIMIT = 0.03
"""The seed sd above which a paradigm's recipe is flagged as seed-sensitive (issue 33)."""


def _spread_cells(
    spread: dict[str, Any], seeds: list[Any], ar: dict[Any, float] | None
) -> dict[str, str]:
    listed = spread.get("accuracies")
    accuracies = [float(a) for a in listed] if isinstance(listed, list) else []
    mean, sd = spread.get("mean"), spread.get("sd")
    listed = spread.get("tokens_per_forward")
    per_forward = [float(t) for t in listed if not _blank(t)] if isinstance(listed, list) else []
    cells = {
        "accuracy per seed": ", ".join(fmt(a, ".3f") for a in accuracies),
        "mean ± sd": fmt(mean, ".3f") if _blank(sd) else fmt_pm(mean, sd),
        "sd 95% CI": "" if _blank(sd) or len(accuracies) < 2 else _interval(sd, len(accuracies)),
        "min–max": f"{min(accuracies):.3f}–{max(accuracies):.3f}" if accuracies else "",
        "one-run SE": fmt(spread.get("binomial_se"), ".3f"),
        "tokens/forward": fmt(statistics.fmean(per_forward), ".2f") if per_forward else "",
        "− AR per seed": "",
        "worst − AR": "",
        "sign on every seed": "",
        "sd > 0.03": "" if _blank(sd) else ("yes" if sd > SEED_SD_LIMIT else "no"),
    }
    gaps = [a - ar[s] for s, a in zip(seeds, accuracies, strict=False) if ar and s in ar]
    if gaps:
        cells["− AR per seed"] = ", ".join(f"{g:+.3f}" for g in gaps)
        cells["worst − AR"] = f"{min(gaps):+.3f}"
        signs = {(g > 0) - (g < 0) for g in gaps}
        named = {frozenset({1}): "above AR", frozenset({-1}): "below AR", frozenset({0}): "tie"}
        cells["sign on every seed"] = named.get(frozenset(signs), "mixed")
    return cells


def _interval(sd: float, n: int) -> str:
    lo, hi = sd_interval(sd, n)
    return f"[{lo:.3f}, {hi:.3f}]"


def _decode_label(decode: object) -> str:
    """``verify W8`` for ``{"verify": True, "window": 8}``: the extra decode's knobs, short."""
    if not isinstance(decode, dict):
        return str(decode or "")
    parts = []
    for key, value in sorted(decode.items()):
        if value is True:
            parts.append(key)
        elif key == "window":
            parts.append(f"W{value}")
        elif key == "threshold":
            parts.append(f"τ{value}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def lossless_table(lossless: pd.DataFrame) -> pd.DataFrame:
    """One row per lossless method of the test prompts: accuracy, tokens/s (3 significant
    figures), tokens per forward, drafts accepted, rows identical to its reference (n/N), and
    the speedups over AR and over the fastest AR + speculative method with their paired CIs."""
    if lossless.empty:
        return pd.DataFrame()
    rows = []
    for r in lossless.to_dict("records"):
        accepted = r.get("draft_acceptance")
        reference = r.get("reference")
        same = r.get("identical_to_reference")
        rows.append(
            {
                "task": r["task"],
                "method": r["method"],
                "accuracy": fmt(r.get("accuracy"), ".3f"),
                "tokens/s": fmt_rate(r.get("tokens_per_second")),
                "tokens/forward": fmt(r.get("tokens_per_forward"), ".2f"),
                "drafts accepted": "" if _blank(accepted) else f"{accepted:.0%}",
                "identical to its reference": ""
                if _blank(reference) or _blank(same)
                else f"{reference}: {int(same)}/{int(r.get('n'))}",
                "× AR [95% CI]": _ratio_ci(r, "speedup_vs_ar"),
                "× fastest AR + speculative [95% CI]": ""
                if _blank(r.get("speedup_vs_best"))
                else f"{_ratio_ci(r, 'speedup_vs_best')} vs {r.get('speedup_vs_best_baseline')}",
            }
        )
    return pd.DataFrame(rows)


def aup_table(points: pd.DataFrame, lossless: pd.DataFrame) -> pd.DataFrame:
    """Per task and method, d3LLM's accuracy under parallelism (`analysis.
    accuracy_under_parallelism`): each paradigm of our engine over its bench front (accuracy vs
    tokens per forward, batch 1), and each speculative method of the lossless stage as its one
    point; the points used, their tokens/forward and accuracy ranges. Highest AUP first."""
    curves: list[tuple[str, str, pd.DataFrame]] = []
    if not points.empty:
        ours = points[
            (points["engine"] == "setdiff")
            & (points.get("source", "bench") == "bench")
            & (points.get("regime", "latency") == "latency")
        ]
        for (task, paradigm), group in ours.groupby(["task", "paradigm"], sort=False):
            front = group[pareto_mask(group, "tokens_per_forward")]
            curves.append((str(task), str(paradigm), front))
    if not lossless.empty:
        fast = lossless[lossless["tokens_per_forward"] > 1]
        for r in fast.itertuples(index=False):
            one = pd.DataFrame(
                [{"tokens_per_forward": r.tokens_per_forward, "accuracy": r.accuracy}]
            )
            curves.append((str(r.task), f"{r.method} (lossless)", one))
    if not curves:
        return pd.DataFrame()
    best: dict[str, float] = {}
    for task, _, frame in curves:
        best[task] = max(best.get(task, 0.0), 100 * float(frame["accuracy"].max()))
    rows = []
    for task, method, frame in curves:
        rho, y = frame["tokens_per_forward"].to_list(), (100 * frame["accuracy"]).to_list()
        score = accuracy_under_parallelism(rho, y, best[task])
        kept = [a for a in y if a >= y[int(np.argmin(rho))] - 5.0]
        rows.append(
            {
                "task": task,
                "method": method,
                "AUP": score,
                "points": f"{len(kept)} of {len(frame)}",
                "tokens/forward": _span(frame["tokens_per_forward"], ".2f"),
                "accuracy": _span(frame["accuracy"], ".3f"),
            }
        )
    table = pd.DataFrame(rows).sort_values(["task", "AUP"], ascending=[True, False], kind="stable")
    return table.assign(AUP=table["AUP"].map(lambda v: fmt(v, ".1f"))).reset_index(drop=True)


def _span(values: pd.Series, spec: str) -> str:
    low, high = float(values.min()), float(values.max())
    return fmt(low, spec) if low == high else f"{fmt(low, spec)}–{fmt(high, spec)}"


def _ratio_ci(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if _blank(value):
        return ""
    return fmt_ci(value, row.get(f"{key}_lo"), row.get(f"{key}_hi"), ".2f")


def setsize_table(
    setsize: pd.DataFrame, evaluate: pd.DataFrame, train: pd.DataFrame
) -> pd.DataFrame:
    """Accuracy per set size D and window W: the set-size study's rows beside the main run's
    model (its own D and W as the stage recorded them; accuracy from the evaluate stage, steps
    from the train stage), each with its 95% Wilson interval and its gap to the main run's AR on
    the same test prompts."""
    if setsize.empty:
        return pd.DataFrame()
    main: dict[tuple[str, str], float] = {}
    if not evaluate.empty and "accuracy" in evaluate:
        main = {(r.task, r.paradigm): r.accuracy for r in evaluate.itertuples()}
    steps: dict[tuple[str, str], Any] = {}
    if not train.empty and "steps" in train:
        steps = {(r.task, r.paradigm): r.steps for r in train.itertuples()}
    records = setsize.to_dict("records")
    own_rows = {(r["task"], r["paradigm"]): r for r in records}
    for (task, paradigm), r in sorted(own_rows.items()):
        own = main.get((task, paradigm))
        if own is not None and not _blank(r.get("main_set_size")):
            records.append(
                {
                    "task": task,
                    "paradigm": paradigm,
                    "set_size": r["main_set_size"],
                    "window": r.get("main_window"),
                    "accuracy": own,
                    "n_examples": r["n_examples"],
                    "steps": steps.get((task, paradigm)),
                    "model": "main run",
                }
            )
    rows = []
    ordered = sort_paradigms(pd.DataFrame(records), then=("set_size", "window"))
    for r in ordered.to_dict("records"):
        acc, n = float(r["accuracy"]), r.get("n_examples")
        ar = main.get((r["task"], "ar"))
        rows.append(
            {
                "task": r["task"],
                "paradigm": r["paradigm"],
                "D (trained)": fmt(r.get("set_size"), ".0f"),
                "W": fmt(r.get("window"), ".0f"),
                "accuracy": fmt_accuracy(acc, n),
                "gap to AR (pts)": "" if ar is None else f"{100 * (acc - ar):+.1f}",
                "steps": fmt(r.get("steps"), ".0f"),
                "model": "" if _blank(r.get("model")) else r["model"],
            }
        )
    return pd.DataFrame(rows)


def fmt_accuracy(accuracy: float, n: object) -> str:
    """``0.930 [0.905, 0.949]``: an accuracy with its 95% Wilson interval over `n` prompts."""
    if _blank(n) or not n:
        return fmt(accuracy, ".3f")
    low, high = wilson_interval(float(accuracy), int(float(n)))  # type: ignore[arg-type]
    return fmt_ci(accuracy, low, high)


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_setdlm_accuracy(column: str) -> bool:
    parts = column.split("_")
    return parts[0] == "setdlm" and parts[1].startswith("d") and parts[-1] != "loss"


def _accuracy_title(column: str) -> str:
    if column == "ar":
        return "ar"
    d = column.split("_")[1][1:]
    return f"setdlm D={d} W=1" if column.endswith("_w1") else f"setdlm D={d} W={d}"


def fmt_pm(value: float, error: float, spec: str = ".3f") -> str:
    """``value ± error``."""
    return f"{value:{spec}} ± {error:{spec}}"


def run_facts_table(
    params: dict[str, Any], comparisons: pd.DataFrame, fingerprints: pd.DataFrame
) -> pd.DataFrame:
    """What a reviewer asks first, from params.yaml and the run's own records: the machine,
    split sizes, training seeds and threads, which split chose each operating point, and how
    the stages ran (one at a time under `dvc repro`; fine-tunes two at a time under `make run`)."""
    if not params:
        return pd.DataFrame()
    rows: list[tuple[str, str]] = []
    prints = (
        fingerprints.drop_duplicates("key").set_index("key")["value"]
        if len(fingerprints)
        else pd.Series(dtype=object)
    )
    machine = ", ".join(
        fmt(prints.get(k))
        for k in ("cpu_model", "device_name", "cpu_capability")
        if not _blank(prints.get(k))
    )
    if machine:
        cores = prints.get("cpu_count")
        rows.append(("machine", machine + ("" if _blank(cores) else f", {fmt(cores)} cores")))
    data = params.get("data") if isinstance(params.get("data"), dict) else {}
    train = params.get("train") if isinstance(params.get("train"), dict) else {}
    for task in (params.get("study") or {}).get("tasks") or []:
        split = data.get(task) if isinstance(data.get(task), dict) else {}
        sizes = [split.get(k) for k in ("n_train", "n_valid", "n_test")]
        if all(v is not None for v in sizes):
            rows.append((f"{task}: train / valid / test examples", " / ".join(map(str, sizes))))
        recipe = train.get(task) if isinstance(train.get(task), dict) else {}
        for role in ("ar", "diffusion"):
            cfg = recipe.get(role) if isinstance(recipe.get(role), dict) else {}
            if cfg:
                rows.append(
                    (
                        f"{task}: {role} training",
                        f"seed {cfg.get('seed', 0)}, {cfg.get('threads', 0) or 'default'} "
                        f"thread(s), {cfg.get('steps')} steps",
                    )
                )
    if not comparisons.empty and "matched" in comparisons:
        for r in comparisons.dropna(subset=["matched"]).to_dict("records"):
            if "chosen on" in str(r["matched"]):
                chosen = str(r["matched"]).split("chosen on ", 1)[1].split(";")[0]
                rows.append(
                    (f"{r['task']}: {r['comparison']}, operating point", f"chosen on {chosen}")
                )
    rows.append(
        (
            "stages",
            "`dvc repro` runs one stage at a time; `make run` runs them as many at a time as "
            "their threads fit the cores (`flows.lanes`; baseline, lmeval and ablate alone); "
            "timed stages interleave their methods per prompt, so a neighbour's load hits all "
            "alike",
        )
    )
    return pd.DataFrame(rows, columns=["fact", "value"])


def fingerprint_table(fingerprints: pd.DataFrame) -> pd.DataFrame:
    """Device, threads, versions, revision and hashes: one row per key, one column per task."""
    if fingerprints.empty:
        return pd.DataFrame()
    wide = fingerprints.pivot_table(index="key", columns="task", values="value", aggfunc="first")
    return wide.map(fmt).rename_axis(None, axis=1).reset_index()


def lock_table(lock: pd.DataFrame) -> pd.DataFrame:
    """dvc.lock collapsed: per stage its deps and outs counted and hashed together (sha256 over
    the sorted (kind, path, md5) entries, 12 hex digits), and the same over every stage first."""
    if lock.empty:
        return pd.DataFrame()

    def digest(frame: pd.DataFrame) -> str:
        entries = sorted(
            f"{r.stage}\t{r.kind}\t{r.path}\t{r.md5}" for r in frame.itertuples(index=False)
        )
        return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:12]

    rows = [{"stage": "all", "deps": "", "outs": "", "sha256": digest(lock)}]
    for stage, group in lock.groupby("stage", sort=False):
        kinds = group["kind"].value_counts()
        rows.append(
            {
                "stage": stage,
                "deps": str(kinds.get("dep", 0)),
                "outs": str(kinds.get("out", 0)),
                "sha256": digest(group),
            }
        )
    return pd.DataFrame(rows)


def missing_table(missing: Sequence[Missing], affects: Sequence[str]) -> pd.DataFrame:
    """What is missing, what is wrong with it, and which figures/tables it disabled."""
    return pd.DataFrame(
        {
            "input": [m.path for m in missing],
            "problem": [m.problem for m in missing],
            "optional": ["yes" if m.optional else "no" for m in missing],
            "affects": list(affects),
        }
    )


def metrics_diff_table(
    a: pd.DataFrame, b: pd.DataFrame, labels: tuple[str, str], *, changed_only: bool = True
) -> pd.DataFrame:
    """`dvc metrics diff`-style: path, metric, value in each run, change; rows only in one run too.

    Args:
        a, b: `reports.inputs.run.flatten_metrics` frames (path, key, value) of the two runs.
    """
    merged = a.merge(b, on=["path", "key"], how="outer", suffixes=("_a", "_b"), sort=True)
    delta = merged["value_b"] - merged["value_a"]
    changed = ~((merged["value_a"] == merged["value_b"]) | (delta.abs() < 1e-12))
    if changed_only:
        merged, delta = merged[changed], delta[changed]
    relative = delta / merged["value_a"].abs().where(merged["value_a"] != 0)
    return pd.DataFrame(
        {
            "path": merged["path"],
            "metric": merged["key"],
            labels[0]: merged["value_a"].map(lambda v: fmt(v, ".4g")),
            labels[1]: merged["value_b"].map(lambda v: fmt(v, ".4g")),
            "change": delta.map(lambda v: fmt(v, "+.4g")),
            "change %": (relative * 100).map(lambda v: fmt(v, "+.1f")),
        }
    ).reset_index(drop=True)


def points_diff_table(points: pd.DataFrame, labels: tuple[str, str]) -> pd.DataFrame:
    """Per configuration present in either run: accuracy and tokens/s side by side, speed ratio.

    Args:
        points: `summarize_configs` output of both runs with a ``run`` column holding `labels`.
    """
    key = ["task", "series", "config"]
    a = points[points["run"] == labels[0]].set_index(key)
    b = points[points["run"] == labels[1]].set_index(key)
    both = a[["accuracy", "tokens_per_second"]].join(
        b[["accuracy", "tokens_per_second"]], how="outer", lsuffix="_a", rsuffix="_b"
    )
    ratio = both["tokens_per_second_b"] / both["tokens_per_second_a"]
    table = pd.DataFrame(
        {
            f"accuracy {labels[0]}": both["accuracy_a"].map(lambda v: fmt(v, ".3f")),
            f"accuracy {labels[1]}": both["accuracy_b"].map(lambda v: fmt(v, ".3f")),
            f"tokens/s {labels[0]}": both["tokens_per_second_a"].map(lambda v: fmt(v, ",.1f")),
            f"tokens/s {labels[1]}": both["tokens_per_second_b"].map(lambda v: fmt(v, ",.1f")),
            "speed ratio": ratio.map(lambda v: fmt(v, ".2f")),
        }
    )
    return table.reset_index()
