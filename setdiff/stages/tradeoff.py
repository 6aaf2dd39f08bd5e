"""DVC stage ``tradeoff``: the headline speed ratios of one task, with bootstrap CIs.

``setdiff tradeoff --task arith`` reads ``results/bench/<task>.csv`` (and, when present,
``results/baseline/<task>.csv`` with AR served by other engines) and writes
``metrics/tradeoff/<task>.json``:
- ``setdlm_vs_ar``: setdlm tokens/s over our AR decoder's, at the fastest setdlm configuration that
  loses at most ``max_drop`` (2 points) of its threshold-off accuracy; with tokens per forward and
  the cost of a setdlm forward relative to an AR forward (both from the same rows);
- ``setdlm_vs_bd3lm``, ``aogpt_vs_mdlm``: speed at matched accuracy (the best level both reach);
- ``ar_engines``: each AR engine's speed over our AR decoder, measured side by side in the
  baseline stage, and the setdlm ratio chained through it (``setdlm_vs_<engine>``).
All ratios are measured side by side in one process and carry 95% bootstrap intervals over
examples (paired). A ratio whose inputs are missing is reported as missing, with the reason.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from setdiff.artifacts import write_json
from setdiff.measure import read_rows
from setdiff.tradeoff import Key, Point, bootstrap, group, matched_speedup, summarize, within_drop

log = logging.getLogger(__name__)


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


def setdlm_vs_ar(rows: list[dict[str, Any]], max_drop: float, n_boot: int) -> dict[str, Any]:
    grouped = group(rows)
    points = summarize(grouped)
    reference = setdlm_reference(rows)
    ar = _keys(points, "ar")
    if reference is None or not ar:
        return {"missing": "needs setdlm threshold-off and ar rows"}
    chosen = within_drop(points, _keys(points, "setdlm"), reference, max_drop)
    ar_key = ar[0]

    def stat(pts: dict[Key, Point]) -> float | None:
        pick = within_drop(pts, _keys(pts, "setdlm"), reference, max_drop)
        return pick.tokens_per_second / pts[ar_key].tokens_per_second if pick else None

    est, low, high = bootstrap(grouped, stat, n_boot=n_boot)
    return {
        "speedup": est,
        "ci95": [low, high],
        "max_drop": max_drop,
        "reference": _point(points[reference]),
        "setdlm": _point(chosen),
        "ar": _point(points[ar_key]),
        "forward_cost_ratio": forward_cost_ratio(rows, chosen.key, ar_key) if chosen else None,
    }


def matched(rows: list[dict[str, Any]], method: str, baseline: str, n_boot: int) -> dict[str, Any]:
    grouped = group(rows)
    points = summarize(grouped)
    a, b = _keys(points, method), _keys(points, baseline)
    found = matched_speedup(points, a, b)
    if found is None:
        return {"missing": f"needs {method} and {baseline} rows"}

    def stat(pts: dict[Key, Point]) -> float | None:
        hit = matched_speedup(pts, a, b)
        return hit["speedup"] if hit else None

    est, low, high = bootstrap(grouped, stat, n_boot=n_boot)
    return {
        "speedup": est,
        "ci95": [low, high],
        "accuracy_level": found["accuracy_level"],
        method: _point(found["method"]),
        baseline: _point(found["baseline"]),
    }


def engines(
    baseline_rows: list[dict[str, Any]], setdlm_ar: dict[str, Any], n_boot: int
) -> dict[str, Any]:
    """AR engines against our AR decoder, measured side by side in the baseline stage (batch 1)."""
    grouped = group(r for r in baseline_rows if r["regime"] == "latency")
    points = summarize(grouped)
    own = [k for k in points if k[1] == "setdiff"]
    out: dict[str, Any] = {}
    for key in points:
        if key[1] == "setdiff" or not own:
            continue
        own_key = own[0]

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
    result: dict[str, Any] = {"task": args.task}
    result["setdlm_vs_ar"] = setdlm_vs_ar(rows, args.max_drop, args.n_boot)
    result["setdlm_vs_bd3lm"] = matched(rows, "setdlm", "bd3lm", args.n_boot)
    result["aogpt_vs_mdlm"] = matched(rows, "aogpt", "mdlm", args.n_boot)
    result["points"] = [_point(p) | {"paradigm": k[0]} for k, p in summarize(group(rows)).items()]
    baseline = root / "results" / "baseline" / f"{args.task}.csv"
    result["ar_engines"] = (
        engines(read_rows(baseline), result["setdlm_vs_ar"], args.n_boot)
        if baseline.exists()
        else {"missing": f"{baseline} not found"}
    )
    write_json(root / "metrics" / "tradeoff" / f"{args.task}.json", result)
    for name in ("setdlm_vs_ar", "setdlm_vs_bd3lm", "aogpt_vs_mdlm"):
        log.info(
            "%s: %s",
            name,
            {k: v for k, v in result[name].items() if k in ("speedup", "ci95", "missing")},
        )
