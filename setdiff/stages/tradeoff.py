"""Headline speed ratios at matched accuracy, with bootstrap CIs; metrics/.

DVC stage ``tradeoff``.

``setdiff tradeoff --task arith`` reads ``results/bench/<task>.csv`` (and, when present,
``results/baseline/<task>.csv`` with AR served by other engines) and writes
``metrics/tradeoff/<task>.json``:
- ``setdlm_vs_ar``: setdlm tokens/s over our AR decoder's, at the fastest lossless setdlm
  configuration (verify, or W = 1) whose accuracy is at most ``max_drop`` (2 points) below
  AR's; the test accuracy difference to AR with its paired CI; tokens per forward and the cost
  of a setdlm forward relative to an AR forward (both from the same rows); and ``lossy``: the
  faster points of setdlm's front (thresholds), each with its speedup and accuracy cost;
- ``setdlm_vs_bd3lm``, ``aogpt_vs_mdlm``: speed at matched accuracy (the best level both reach),
  the test accuracy difference with its paired CI, and ``dominates`` (at least as accurate,
  and faster with the CI above 1);
- ``ar_engines``: each AR engine's speed over our AR decoder, measured side by side in the
  baseline stage, and the setdlm ratio chained through it (``setdlm_vs_<engine>``).
All ratios are measured side by side in one process and carry 95% bootstrap intervals over
examples (paired). A ratio whose inputs are missing is reported as missing, with the reason.

Where the bench measured validation prompts too (``results/bench/<task>.select.csv``,
``bench.run.n_select``), every operating point (the configuration within ``max_drop``, the
matched accuracy level) is chosen on them and the test prompts measure that fixed choice: the
headline is then free of selection on the test set, and its CI is over prompts at one
configuration (``selected_on`` says which split chose; ``test_drop`` is the test accuracy the
chosen configuration gives up against setdlm's own threshold-off, with its CI).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from setdiff.files import finite_or_none, write_json
from setdiff.measure import read_rows
from setdiff.tradeoff import (
    Key,
    Point,
    bootstrap,
    fastest_at,
    group,
    matched_speedup,
    pareto,
    summarize,
)

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ()
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""


def _keys(points: dict[Key, Any], paradigm: str, engine: str = "setdiff") -> list[Key]:
    return [k for k in points if k[0] == paradigm and k[1] == engine]


def _point(p: Point | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "config": p.key[2],
        "engine": p.key[1],
        "accuracy": p.accuracy,
        "tokens_per_second": p.tokens_per_second,
        "tokens_per_forward": p.tokens_per_forward,
        "latency_s": p.latency_s,
        "nfe": p.nfe,
        "n": p.n,
    }


def setdlm_reference(rows: list[dict[str, Any]]) -> Key | None:
    """setdlm's threshold-off configuration with the smallest window (its accuracy anchor)."""
    off = [r for r in rows if r["paradigm"] == "setdlm" and r["threshold"] is None]
    if not off:
        return None
    best = min(off, key=lambda r: r["window"] or 0)
    return ("setdlm", "setdiff", best["config"])


def forward_cost_ratio(rows: list[dict[str, Any]], a: Key, b: Key) -> float:
    """Mean seconds per forward of configuration a over b (same examples, same run)."""

    def per_forward(key: Key) -> float:
        sel = [r for r in rows if (r["paradigm"], r["engine"], r["config"]) == key]
        return sum(r["forward_s"] for r in sel) / sum(r["nfe"] for r in sel)

    return per_forward(a) / per_forward(b)


Choice = Callable[[dict[Key, Point]], "tuple[Key, Key] | None"]
"""``choose(points) -> (method key, baseline key) | None``: the two configurations to compare."""


def held_out_ratio(
    rows: list[dict[str, Any]],
    select_rows: list[dict[str, Any]] | None,
    choose: Choice,
    n_boot: int,
) -> tuple[tuple[Key, Key] | None, tuple[float, float, float], dict[str, Any]]:
    """The chosen pair, its tokens/s ratio on the test rows with a bootstrap CI, and where the
    choice was made. With `select_rows` the pair is chosen there once and the bootstrap resamples
    the test rows at that fixed pair; without, it is chosen on the test rows and every resample
    chooses again."""
    grouped = group(rows)
    fixed = choose(summarize(group(select_rows))) if select_rows else None

    def stat(pts: dict[Key, Point]) -> float | None:
        pair = fixed if select_rows else choose(pts)
        if pair is None or pair[0] not in pts or pair[1] not in pts:
            return None
        return pts[pair[0]].tokens_per_second / pts[pair[1]].tokens_per_second

    pair = fixed if select_rows else choose(summarize(grouped))
    where = {"split": "validation" if select_rows else "test"}
    where["n"] = len({int(r["example"]) for r in (select_rows or rows)})
    return pair, bootstrap(grouped, stat, n_boot=n_boot), where


def setdlm_vs_ar(
    rows: list[dict[str, Any]],
    max_drop: float,
    n_boot: int,
    select_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """setdlm over our AR decoder at the fastest **lossless** setdlm configuration (its output is
    its own W = 1 greedy decode: `lossless_configs`) whose accuracy is within `max_drop` of
    **AR's**, chosen on `select_rows` when given (`held_out_ratio`); the test accuracy
    difference to AR with its paired CI; and the lossy operating points (the faster points of
    setdlm's front: thresholds), each with its speedup and its accuracy cost against AR on the
    test rows. Lossy points are not headline candidates: their accuracy cost is a noisy estimate
    on a few hundred validation prompts (the default run of 2026-12-05 chose τ 0.9 at -1.2
    points on validation, -6.2 on test), a lossless one's is the model's own."""
    points = summarize(group(rows))
    reference = setdlm_reference(rows)
    ar = _keys(points, "ar")
    if reference is None or not ar:
        return {"missing": "needs setdlm threshold-off and ar rows"}
    ar_key = ar[0]

    exact = lossless_configs(rows)

    def choose(pts: dict[Key, Point]) -> tuple[Key, Key] | None:
        candidates = [pts[k] for k in _keys(pts, "setdlm") if k in exact]
        pick = fastest_at(candidates, pts[ar_key].accuracy - max_drop) if ar_key in pts else None
        return (pick.key, ar_key) if pick else None

    pair, (est, low, high), where = held_out_ratio(rows, select_rows, choose, n_boot)
    chosen_on = summarize(group(select_rows)) if select_rows else points
    picked = pair is not None and pair[0] in points
    floor = chosen_on[pair[0]].tokens_per_second if picked and pair[0] in chosen_on else 0.0
    lossy = [
        lossy_point(rows, p.key, ar_key, n_boot)
        for p in pareto(chosen_on[k] for k in _keys(chosen_on, "setdlm"))
        if p.tokens_per_second > floor and p.key in points
    ]
    if not picked:
        split = where["split"]
        why = f"no setdlm configuration within max_drop of AR on the {split} rows"
        return {"missing": why, "lossy": lossy}
    key = pair[0]
    drop, drop_low, drop_high = bootstrap(
        group(rows), lambda pts: pts[reference].accuracy - pts[key].accuracy, n_boot=n_boot
    )
    return {
        "speedup": est,
        "ci95": [low, high],
        "max_drop": max_drop,
        "anchor": "ar",
        "selected_on": where,
        "accuracy_diff": accuracy_diff(rows, key, ar_key, n_boot),
        "test_drop": {"estimate": drop, "ci95": [drop_low, drop_high]},
        "reference": _point(points[reference]),
        "setdlm": _point(points[key]),
        "ar": _point(points[ar_key]),
        "forward_cost_ratio": forward_cost_ratio(rows, key, ar_key),
        "lossy": lossy,
    }


def lossless_configs(rows: list[dict[str, Any]]) -> set[Key]:
    """setdlm configurations whose output is by construction its W = 1 greedy decode: verify
    (self-speculative) at any window, and W = 1 itself (threshold off)."""
    out = set()
    for r in rows:
        if r["paradigm"] != "setdlm":
            continue
        verify = "verify=True" in str(r["config"])
        plain = r.get("window") == 1 and r.get("threshold") is None
        if verify or plain:
            out.add((r["paradigm"], r["engine"], r["config"]))
    return out


def accuracy_diff(rows: list[dict[str, Any]], a: Key, b: Key, n_boot: int) -> dict[str, Any]:
    """Test accuracy of `a` minus `b` on the same prompts, with a paired bootstrap 95% CI."""
    est, low, high = bootstrap(
        group(rows), lambda pts: pts[a].accuracy - pts[b].accuracy, n_boot=n_boot
    )
    return {"estimate": est, "ci95": [low, high]}


def lossy_point(rows: list[dict[str, Any]], key: Key, ar_key: Key, n_boot: int) -> dict[str, Any]:
    """A setdlm configuration outside the tolerance: its speedup over AR and accuracy cost."""
    grouped = group(rows)
    est, low, high = bootstrap(
        grouped,
        lambda pts: pts[key].tokens_per_second / pts[ar_key].tokens_per_second,
        n_boot=n_boot,
    )
    return {
        "setdlm": _point(summarize(grouped)[key]),
        "speedup": est,
        "ci95": [low, high],
        "accuracy_diff": accuracy_diff(rows, key, ar_key, n_boot),
    }


def matched(
    rows: list[dict[str, Any]],
    method: str,
    baseline: str,
    n_boot: int,
    select_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`method` over `baseline` at the best accuracy both reach, chosen on `select_rows` when
    given (`held_out_ratio`), with the test accuracy difference (paired CI) and whether the
    method dominates (at least as accurate on test, and faster: CI above 1)."""
    points = summarize(group(rows))

    def hit(pts: dict[Key, Point]) -> dict[str, Any] | None:
        return matched_speedup(pts, _keys(pts, method), _keys(pts, baseline))

    def choose(pts: dict[Key, Point]) -> tuple[Key, Key] | None:
        found = hit(pts)
        return (found["method"].key, found["baseline"].key) if found else None

    pair, (est, low, high), where = held_out_ratio(rows, select_rows, choose, n_boot)
    if pair is None or pair[0] not in points or pair[1] not in points:
        return {"missing": f"needs {method} and {baseline} rows ({where['split']} and test)"}
    level = hit(summarize(group(select_rows)) if select_rows else points)["accuracy_level"]
    diff = accuracy_diff(rows, pair[0], pair[1], n_boot)
    return {
        "speedup": est,
        "ci95": [low, high],
        "accuracy_level": level,
        "selected_on": where,
        "accuracy_diff": diff,
        "dominates": bool(diff["estimate"] >= 0 and low > 1),
        method: _point(points[pair[0]]),
        baseline: _point(points[pair[1]]),
    }


def engines(
    baseline_rows: list[dict[str, Any]], setdlm_ar: dict[str, Any], n_boot: int
) -> dict[str, Any]:
    """AR engines against our AR decoder, measured side by side in the baseline stage (batch 1):
    each over our decoder's rows of its own pass (config ``greedy beside <engine>``, for the
    engines timed on their own after the others) or else of the shared pass (``greedy``)."""
    grouped = group(r for r in baseline_rows if r["regime"] == "latency")
    points = summarize(grouped)
    out: dict[str, Any] = {}
    for key in points:
        if key[1] == "setdiff":
            continue
        beside, shared = ("ar", "setdiff", f"greedy beside {key[1]}"), ("ar", "setdiff", "greedy")
        own_key = beside if beside in points else shared
        if own_key not in points:
            continue

        def stat(pts: dict[Key, Point], key: Key = key, own_key: Key = own_key) -> float | None:
            return pts[key].tokens_per_second / pts[own_key].tokens_per_second

        est, low, high = bootstrap(grouped, stat, n_boot=n_boot)
        entry = {
            "engine_over_own_ar": est,
            "ci95": [low, high],
            "engine": _point(points[key]),
            "own_ar": _point(points[own_key]),
        }
        if "speedup" in setdlm_ar and est and math.isfinite(est):
            entry[f"setdlm_vs_{key[1]}"] = setdlm_ar["speedup"] / est
        out[f"{key[1]}:{key[2]}"] = entry
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff tradeoff",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", required=True)
    parser.add_argument("--root", default=".")
    parser.add_argument("--max-drop", type=float, default=0.02)
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    root = Path(args.root)
    bench = root / "results" / "bench" / f"{args.task}.csv"
    if not bench.exists():
        raise FileNotFoundError(f"{bench} is missing: run `setdiff bench --task {args.task}`")
    rows = read_rows(bench)
    select_path = bench.with_suffix(".select.csv")
    select = read_rows(select_path) if select_path.exists() else []
    result: dict[str, Any] = {"task": args.task}
    result["setdlm_vs_ar"] = setdlm_vs_ar(rows, args.max_drop, args.n_boot, select)
    result["setdlm_vs_bd3lm"] = matched(rows, "setdlm", "bd3lm", args.n_boot, select)
    result["aogpt_vs_mdlm"] = matched(rows, "aogpt", "mdlm", args.n_boot, select)
    result["points"] = [_point(p) | {"paradigm": k[0]} for k, p in summarize(group(rows)).items()]
    baseline = root / "results" / "baseline" / f"{args.task}.csv"
    result["ar_engines"] = (
        engines(read_rows(baseline), result["setdlm_vs_ar"], args.n_boot)
        if baseline.exists()
        else {"missing": f"{baseline} not found"}
    )
    # a CI or rate that cannot be computed (no common examples, zero latency) is null
    write_json(root / "metrics" / "tradeoff" / f"{args.task}.json", finite_or_none(result))
    for name in ("setdlm_vs_ar", "setdlm_vs_bd3lm", "aogpt_vs_mdlm"):
        log.info(
            "%s: %s",
            name,
            {k: v for k, v in result[name].items() if k in ("speedup", "ci95", "missing")},
        )
