"""Speed-quality trade-offs from measured rows: per-configuration summaries, Pareto frontiers,
and speedups at matched accuracy with bootstrap confidence intervals over examples.

Pure functions over `setdiff.measure` rows (dicts); numpy only. A configuration is identified by
(paradigm, engine, config label). Speed is tokens per second = total new tokens / total latency
over the examples (a ratio of sums, so long answers weigh more, as they do for a user).

Every configuration of a task is measured on the same example indices, so a bootstrap resample
of example indices is applied to all configurations at once (paired resampling).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

Key = tuple[str, str, str]  # (paradigm, engine, config)


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    key: Key
    accuracy: float
    tokens_per_second: float
    tokens_per_forward: float
    latency_s: float
    nfe: float
    n: int


def group(rows: Iterable[Mapping[str, Any]]) -> dict[Key, dict[int, Mapping[str, Any]]]:
    """Rows by configuration, then by example index."""
    out: dict[Key, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for row in rows:
        out[(row["paradigm"], row["engine"], row["config"])][int(row["example"])] = row
    return dict(out)


def _point(key: Key, rows: Sequence[Mapping[str, Any]]) -> Point:
    tokens = sum(r["new_tokens"] for r in rows)
    latency = sum(r["latency_s"] for r in rows)
    nfe = sum(r["nfe"] for r in rows)
    return Point(
        key=key,
        accuracy=float(np.mean([r["exact"] for r in rows])),
        tokens_per_second=tokens / latency if latency else math.nan,
        tokens_per_forward=tokens / nfe if nfe else math.nan,
        latency_s=latency / len(rows),
        nfe=nfe / len(rows),
        n=len(rows),
    )


def summarize(
    grouped: Mapping[Key, Mapping[int, Mapping[str, Any]]], examples: Sequence[int] | None = None
) -> dict[Key, Point]:
    """One `Point` per configuration over `examples` (all of each configuration's by default)."""
    points = {}
    for key, by_example in grouped.items():
        ids = list(by_example) if examples is None else [i for i in examples if i in by_example]
        if ids:
            points[key] = _point(key, [by_example[i] for i in ids])
    return points


def pareto(points: Iterable[Point]) -> list[Point]:
    """Configurations not dominated in (accuracy up, tokens/s up), sorted by speed."""
    pts = sorted(points, key=lambda p: (-p.tokens_per_second, -p.accuracy))
    front, best = [], -math.inf
    for p in pts:
        if p.accuracy > best:
            front.append(p)
            best = p.accuracy
    return sorted(front, key=lambda p: p.tokens_per_second)


def fastest_at(points: Iterable[Point], accuracy: float) -> Point | None:
    """The fastest configuration reaching `accuracy` (None if none does)."""
    ok = [p for p in points if p.accuracy >= accuracy - 1e-12]
    return max(ok, key=lambda p: p.tokens_per_second) if ok else None


def matched_speedup(
    points: Mapping[Key, Point],
    method: Sequence[Key],
    baseline: Sequence[Key],
    tolerance: float = 0.0,
) -> dict[str, Any] | None:
    """Speed of `method` over `baseline` at the best accuracy both reach.

    The matched level is ``min(best accuracy of method, best accuracy of baseline) - tolerance``;
    each side contributes its fastest configuration at or above that level.
    """
    a = [points[k] for k in method if k in points]
    b = [points[k] for k in baseline if k in points]
    if not a or not b:
        return None
    level = min(max(p.accuracy for p in a), max(p.accuracy for p in b)) - tolerance
    pa, pb = fastest_at(a, level), fastest_at(b, level)
    if pa is None or pb is None:
        return None
    return {
        "accuracy_level": level,
        "method": pa,
        "baseline": pb,
        "speedup": pa.tokens_per_second / pb.tokens_per_second,
    }


def within_drop(
    points: Mapping[Key, Point], method: Sequence[Key], reference: Key, drop: float
) -> Point | None:
    """Fastest configuration of `method` losing at most `drop` accuracy against the better of
    `reference` and the best configuration of `method` (so a configuration that beats the
    reference raises the bar rather than lowering it: the choice never trades more than `drop`
    of the best accuracy measured)."""
    if reference not in points:
        return None
    candidates = [points[k] for k in method if k in points]
    best = max([points[reference].accuracy] + [p.accuracy for p in candidates])
    return fastest_at(candidates, best - drop)


def bootstrap(
    grouped: Mapping[Key, Mapping[int, Mapping[str, Any]]],
    statistic: Any,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(estimate, low, high) of `statistic(points) -> float | None` under paired resampling."""
    examples = sorted(set.intersection(*(set(v) for v in grouped.values())))
    if not examples:
        return math.nan, math.nan, math.nan
    estimate = statistic(summarize(grouped, examples))
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        sample = list(rng.choice(examples, size=len(examples), replace=True))
        value = statistic(summarize(grouped, sample))
        if value is not None and math.isfinite(value):
            values.append(value)
    if estimate is None or not values:
        return (math.nan if estimate is None else estimate), math.nan, math.nan
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(estimate), float(low), float(high)
