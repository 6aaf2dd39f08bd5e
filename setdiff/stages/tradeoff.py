"""DVC stage ``tradeoff``: the headline speed ratios of one task, with bootstrap CIs.

``setdiff tradeoff --task arith`` reads ``results/bench/<task>.csv`` (and, when present,
``results/baseline/<task>.csv`` with AR served by other engines) and writes
``metrics/tradeoff/<task>.json``:
- ``setdlm_vs_ar``: setdlm tokens/s over our AR decoder's, at the fastest setdlm configuration that
  loses at most ``max_drop`` (2 points) of its threshold-off accuracy, or of its best
  configuration's where one beats threshold-off; with tokens per forward and the cost of a setdlm
  forward relative to an AR forward (both from the same rows);
- ``setdlm_vs_bd3lm``, ``aogpt_vs_mdlm``: speed at matched accuracy (the best level both reach);
- ``ar_engines``: each AR engine's speed over our AR decoder, measured side by side in the
  baseline stage, and the setdlm ratio chained through it (``setdlm_vs_<engine>``).
All ratios are measured side by side in one process and carry 95% bootstrap intervals over
examples (paired). A ratio whose inputs are missing is reported as missing, with the reason.

Where the bench measured validation prompts too (``results/bench/<task>.select.csv``,
``bench.run.n_select``), every operating point (the configuration within ``max_drop``, the
matched accuracy level) is chosen on them and the test prompts measure that fixed choice: the
headline is then free of selection on the test set, and its CI is over prompts at one
configuration (``selected_on`` says which split chose; ``test_drop`` is the test accuracy the
chosen configuration gives up against threshold-off, with its CI).
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


def _fixed(a: Key, b: Key) -> Any:
    """The statistic `a`'s tokens/s over `b`'s (configurations fixed beforehand)."""

    def stat(pts: dict[Key, Point]) -> float | None:
        if a not in pts or b not in pts:
            return None
        return pts[a].tokens_per_second / pts[b].tokens_per_second

    return stat


def _selected_on(select_rows: list[dict[str, Any]] | None, n_test: int) -> dict[str, Any]:
    if select_rows:
        n = len({int(r["example"]) for r in select_rows})
        return {"split": "validation", "n": n}
    return {"split": "test", "n": n_test}


def setdlm_vs_ar(
    rows: list[dict[str, Any]],
    max_drop: float,
    n_boot: int,
    select_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """setdlm over our AR decoder at the fastest setdlm configuration within `max_drop` of its
    threshold-off accuracy. With `select_rows` (validation prompts) that configuration is chosen
    there and the test rows measure it, so the CI is over prompts at one fixed configuration;
    without, it is chosen on the test rows and the bootstrap redoes the choice per resample."""
    grouped = group(rows)
    points = summarize(grouped)
    reference = setdlm_reference(rows)
    ar = _keys(points, "ar")
    if reference is None or not ar:
        return {"missing": "needs setdlm threshold-off and ar rows"}
    ar_key = ar[0]
    if select_rows:
        basis = summarize(group(select_rows))
        if reference not in basis:
            return {"missing": f"the validation rows lack {reference[2]!r} of setdlm"}
        pick = within_drop(basis, _keys(basis, "setdlm"), reference, max_drop)
        chosen = points.get(pick.key) if pick else None
        if chosen is None:
            return {"missing": "the setdlm configuration chosen on validation has no test rows"}
        stat = _fixed(chosen.key, ar_key)
    else:
        chosen = within_drop(points, _keys(points, "setdlm"), reference, max_drop)

        def stat(pts: dict[Key, Point]) -> float | None:
            hit = within_drop(pts, _keys(pts, "setdlm"), reference, max_drop)
            return hit.tokens_per_second / pts[ar_key].tokens_per_second if hit else None

    if chosen is None:
        return {"missing": "no setdlm configuration within max_drop"}
    est, low, high = bootstrap(grouped, stat, n_boot=n_boot)
    key = chosen.key
    drop, drop_low, drop_high = bootstrap(
        grouped, lambda pts: pts[reference].accuracy - pts[key].accuracy, n_boot=n_boot
    )
    return {
        "speedup": est,
        "ci95": [low, high],
        "max_drop": max_drop,
        "selected_on": _selected_on(select_rows, points[reference].n),
        "test_drop": {"estimate": drop, "ci95": [drop_low, drop_high]},
        "reference": _point(points[reference]),
        "setdlm": _point(chosen),
        "ar": _point(points[ar_key]),
        "forward_cost_ratio": forward_cost_ratio(rows, key, ar_key),
    }


def matched(
    rows: list[dict[str, Any]],
    method: str,
    baseline: str,
    n_boot: int,
    select_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`method` over `baseline` at the best accuracy both reach: chosen on `select_rows` when
    given (the test rows then measure those two configurations), else on the test rows."""
    grouped = group(rows)
    points = summarize(grouped)
    basis = summarize(group(select_rows)) if select_rows else points
    a, b = _keys(basis, method), _keys(basis, baseline)
    found = matched_speedup(basis, a, b)
    if found is None:
        return {"missing": f"needs {method} and {baseline} rows"}
    ka, kb = found["method"].key, found["baseline"].key
    if ka not in points or kb not in points:
        return {"missing": f"the chosen {method} or {baseline} configuration has no test rows"}
    if select_rows:
        stat = _fixed(ka, kb)
    else:

        def stat(pts: dict[Key, Point]) -> float | None:
            hit = matched_speedup(pts, a, b)
            return hit["speedup"] if hit else None

    est, low, high = bootstrap(grouped, stat, n_boot=n_boot)
    return {
        "speedup": est,
        "ci95": [low, high],
        "accuracy_level": found["accuracy_level"],
        "selected_on": _selected_on(select_rows, points[ka].n),
        method: _point(points[ka]),
        baseline: _point(points[kb]),
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
    write_json(root / "metrics" / "tradeoff" / f"{args.task}.json", result)
    for name in ("setdlm_vs_ar", "setdlm_vs_bd3lm", "aogpt_vs_mdlm"):
        log.info(
            "%s: %s",
            name,
            {k: v for k, v in result[name].items() if k in ("speedup", "ci95", "missing")},
        )
