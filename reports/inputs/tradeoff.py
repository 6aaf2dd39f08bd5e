"""``metrics/tradeoff/<task>.json`` -> one flat record per comparison (pure, no I/O).

Each ``<method>_vs_<baseline>`` section becomes a record with the speedup, its 95% CI, what the
accuracy was matched at, and both sides' configuration; ``ar_engines`` becomes two records per
engine (engine vs our AR decoder, and setdlm vs the engine). A section the pipeline marks
``{"missing": reason}`` keeps its reason, so the report can say why a number is absent.
"""

from __future__ import annotations

from typing import Any


def _point_fields(point: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(point, dict):
        return {}
    keys = ("config", "engine", "accuracy", "tokens_per_second")
    return {f"{prefix}_{k}": point.get(k) for k in keys}


def _comparison(task: str, name: str, body: Any) -> dict[str, Any]:
    method, _, baseline = name.partition("_vs_")
    row: dict[str, Any] = {"task": task, "comparison": f"{method} vs {baseline}"}
    if not isinstance(body, dict) or "missing" in body:
        reason = body.get("missing") if isinstance(body, dict) else "not an object"
        return row | {"missing": str(reason)}
    ci = body.get("ci95") or [None, None]
    row |= {"speedup": body.get("speedup"), "ci_lo": ci[0], "ci_hi": ci[1]}
    row |= _point_fields(body.get(method), "method") | _point_fields(body.get(baseline), "baseline")
    row |= _accuracy_diff(body)
    if "accuracy_level" in body:
        row["matched"] = f"accuracy ≥ {body['accuracy_level']:.3g}"
    elif body.get("anchor") == "ar" and "max_drop" in body:
        row["matched"] = f"within {body['max_drop']:.3g} of ar's accuracy"
    elif isinstance(body.get("reference"), dict) and "max_drop" in body:
        ref = body["reference"]
        row["matched"] = f"within {body['max_drop']:.3g} of {method} {ref.get('config')!r}"
    return row | _selection(body, row.get("matched"))


def _accuracy_diff(body: dict[str, Any]) -> dict[str, Any]:
    """The test accuracy difference (method minus baseline) with its paired CI, and whether the
    method dominates, where the stage computed them."""
    diff = body.get("accuracy_diff")
    if not isinstance(diff, dict):
        return {}
    ci = diff.get("ci95") if isinstance(diff.get("ci95"), list) else [None, None]
    out = {"accuracy_diff": diff.get("estimate"), "diff_lo": ci[0], "diff_hi": ci[1]}
    return out | ({"dominates": body["dominates"]} if "dominates" in body else {})


def _lossy(task: str, body: Any) -> list[dict[str, Any]]:
    """The headline's lossy operating points: setdlm faster than the tolerance allows."""
    points = body.get("lossy") if isinstance(body, dict) else None
    rows = []
    for point in points if isinstance(points, list) else []:
        if not isinstance(point, dict):
            continue
        ci = point.get("ci95") or [None, None]
        row = {"task": task, "comparison": "setdlm vs ar (lossy)", "speedup": point.get("speedup")}
        row |= {"ci_lo": ci[0], "ci_hi": ci[1], "matched": "outside the tolerance: accuracy cost"}
        row |= _point_fields(point.get("setdlm"), "method")
        row |= _point_fields(body.get("ar"), "baseline") | _accuracy_diff(point)
        rows.append(row)
    return rows


def _selection(body: dict[str, Any], matched: str | None) -> dict[str, Any]:
    """Where the operating point was chosen (``selected_on``) and, for the headline, the test
    accuracy it gives up (``test_drop``), appended to the `matched` text."""
    chosen = body.get("selected_on")
    if matched is None or not isinstance(chosen, dict) or "split" not in chosen:
        return {}
    text = f"{matched}; chosen on {chosen.get('n', '?')} {chosen['split']} prompts"
    diff = body.get("accuracy_diff")
    if body.get("anchor") == "ar" and isinstance(diff, dict):
        ci = diff.get("ci95") if isinstance(diff.get("ci95"), list) else []
        if isinstance(diff.get("estimate"), int | float):
            text += f"; on test {diff['estimate']:+.3f}"
            if len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
                text += f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"
            text += " against ar"
        return {"matched": text}
    drop = body.get("test_drop")
    if isinstance(drop, dict) and isinstance(drop.get("estimate"), int | float):
        text += f"; on test {drop['estimate']:.3g}"
        ci = drop.get("ci95")
        if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
            text += f" [{ci[0]:.3g}, {ci[1]:.3g}]"
        text += " below it"
    return {"matched": text}


def _engine_comparisons(task: str, engines: Any, setdlm: Any) -> list[dict[str, Any]]:
    """``ar_engines``: each engine over our AR decoder (measured side by side, with a CI), and
    setdlm over the engine, chained through ``setdlm_vs_ar`` (a ratio without its own CI)."""
    if not isinstance(engines, dict) or "missing" in engines:
        reason = engines.get("missing") if isinstance(engines, dict) else "absent"
        return [{"task": task, "comparison": "ar engines", "missing": str(reason)}]
    rows = []
    for key, body in engines.items():
        point = body.get("engine") if isinstance(body.get("engine"), dict) else {}
        engine = str(point.get("engine") or body.get("engine") or key.split(":")[0])
        ci = body.get("ci95") or [None, None]
        row = {"task": task, "comparison": f"ar · {key} vs ar · setdiff", "ci_lo": ci[0]}
        row |= {"speedup": body.get("engine_over_own_ar"), "ci_hi": ci[1]}
        row |= _point_fields(point, "method") | _point_fields(body.get("own_ar"), "baseline")
        rows.append(row | {"matched": "same model and examples, side by side"})
        chained = body.get(f"setdlm_vs_{engine}")
        label = f"setdlm vs ar · {key}"
        if isinstance(chained, dict):
            rows.append(_comparison(task, f"setdlm_vs_{engine}", chained) | {"comparison": label})
        elif isinstance(chained, int | float):
            matched = "chained: (setdlm vs ar) / (engine vs ar); no CI"
            row = {"task": task, "comparison": label, "speedup": chained, "matched": matched}
            row |= _point_fields(setdlm, "method") | _point_fields(point, "baseline")
            rows.append(row)
        else:
            rows.append({"task": task, "comparison": label, "missing": "not reported"})
    return rows


def _comparison_rank(row: dict[str, Any]) -> int:
    """Headline first: setdlm vs our AR, vs each AR engine, engines vs our AR, then the rest."""
    name = row["comparison"]
    prefixes = ("setdlm vs ar · ", "ar · ")
    if name == "setdlm vs ar":
        return 0
    if name == "setdlm vs ar (lossy)":
        return 1
    return next((i + 2 for i, p in enumerate(prefixes) if name.startswith(p)), len(prefixes) + 2)


def flatten_tradeoff(task: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """metrics/tradeoff/<task>.json -> one dict per comparison (missing ones carry `missing`)."""
    rows = []
    headline = data.get("setdlm_vs_ar")
    setdlm = headline.get("setdlm") if isinstance(headline, dict) else None
    for name, body in data.items():
        if name == "ar_engines":
            rows += _engine_comparisons(task, body, setdlm)
        elif "_vs_" in name:
            rows.append(_comparison(task, name, body))
            if name == "setdlm_vs_ar":
                rows += _lossy(task, body)
    return sorted(rows, key=_comparison_rank)
