"""Per-example result rows: the bench's and the external baselines' CSVs and decode traces,
read with the partial-file checks (declared configurations without rows, non-numeric values,
malformed traces) recorded as `Missing`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reports.inputs.files import flatten_dict, read_csv, read_json, read_jsonl
from reports.inputs.missing import MissingLog, concat

ROW_COLUMNS = ("paradigm", "engine", "config", "example", "new_tokens", "nfe", "latency_s", "exact")
"""Columns a results row file must have to be used at all."""

NUMERIC_COLUMNS = ("example", "new_tokens", "nfe", "latency_s", "exact", "score", "peak_mem_mb")


def numeric_rows(frame: pd.DataFrame, path: str, kind: str, log: MissingLog) -> pd.DataFrame:
    """Numeric columns as numbers; rows whose example, tokens, NFE or latency do not parse are
    dropped and counted (a quality value that does not parse becomes NaN and is counted)."""
    frame = frame.copy()
    bad = 0
    for column in [c for c in NUMERIC_COLUMNS if c in frame]:
        parsed = pd.to_numeric(frame[column], errors="coerce")
        bad += int((parsed.isna() & frame[column].notna()).sum())
        frame[column] = parsed
    keep = frame[["example", "new_tokens", "nfe", "latency_s"]].notna().all(axis=1)
    notes = [f"{bad} non-numeric values"] if bad else []
    if not keep.all():
        notes.append(f"{int((~keep).sum())} rows without example/new_tokens/nfe/latency_s dropped")
    if notes:
        log.add(path, "partial: " + ", ".join(notes), kind)
    return frame[keep].reset_index(drop=True)


def _is_steps(steps: Any) -> bool:
    return isinstance(steps, list) and all(
        isinstance(step, list) and all(isinstance(p, int) for p in step) for step in steps
    )


def _valid_traces(trace: pd.DataFrame, path: str, log: MissingLog) -> pd.DataFrame:
    """Traces with paradigm, config, example and a list-of-int-lists ``steps``; others counted."""
    if trace.empty:
        return trace
    if not {"paradigm", "config", "example", "steps"} <= set(trace.columns):
        log.add(path, "unreadable: records lack paradigm/config/example/steps", "traces")
        return pd.DataFrame()
    ok = trace["steps"].map(_is_steps)
    if not ok.all():
        log.add(path, f"partial: {int((~ok).sum())} traces with malformed steps skipped", "traces")
    return trace[ok].reset_index(drop=True)


def _check_traces(rows: pd.DataFrame, trace: pd.DataFrame, path: str, log: MissingLog) -> None:
    if rows.empty:
        return
    ours = rows[rows["engine"] == "setdiff"]
    want = set(zip(ours["paradigm"], ours["config"], strict=True))
    have = set(zip(trace["paradigm"], trace["config"], strict=True))
    lost = sorted(want - have)
    if lost:
        log.add(path, "no traces for: " + ", ".join(f"{p} {c!r}" for p, c in lost), "traces")


def check_rows(
    frame: pd.DataFrame,
    path: str,
    paradigms: list[str],
    configurations: list[tuple[str, str]],
    log: MissingLog,
) -> None:
    """Partial-file checks: paradigms, declared configurations and examples without rows."""
    have = set(frame["paradigm"].astype(str))
    absent = [p for p in paradigms if p not in have]
    if absent:
        log.add(path, f"no rows for paradigm(s): {', '.join(absent)}", "bench")
    keys = set(zip(frame["paradigm"].astype(str), frame["config"].astype(str), strict=True))
    lost = [f"{p} {c!r}" for p, c in configurations if p in have and (p, c) not in keys]
    if lost:
        log.add(path, f"no rows for configuration(s): {', '.join(lost)}", "bench")
    counts = frame.groupby(["paradigm", "engine", "config"]).size()
    short = counts[counts < counts.max()]
    if len(short):
        items = [f"{p} {c!r} ({n} of {counts.max()})" for (p, _, c), n in short.items()]
        log.add(path, f"partial: fewer examples for {', '.join(items)}", "bench")


def load_bench(
    root: Path, tasks: list[str], paradigms: list[str], log: MissingLog
) -> tuple[pd.DataFrame, ...]:
    rows, traces, prints = [], [], []
    for task in tasks:
        base = f"results/bench/{task}"
        meta, problem = read_json(root / f"{base}.json")
        log.add(f"{base}.json", problem, "bench_meta")
        meta = meta if isinstance(meta, dict) else {}
        declared = [(c.get("paradigm"), c.get("config")) for c in meta.get("configurations", [])]
        frame, problem = read_csv(root / f"{base}.csv", ROW_COLUMNS)
        log.add(f"{base}.csv", problem, "bench")
        if not frame.empty:
            frame = numeric_rows(frame, f"{base}.csv", "bench", log)
            frame["task"] = task
            check_rows(frame, f"{base}.csv", paradigms, declared, log)
            rows.append(frame)
        records, problem = read_jsonl(root / f"{base}.traces.jsonl")
        log.add(f"{base}.traces.jsonl", problem, "traces")
        trace = _valid_traces(pd.DataFrame(records), f"{base}.traces.jsonl", log)
        if not trace.empty:
            trace["task"] = task
            traces.append(trace)
            _check_traces(frame, trace, f"{base}.traces.jsonl", log)
        fingerprint = meta.get("fingerprint") or {}
        prints += [
            {"task": task, "key": k, "value": v} for k, v in flatten_dict(fingerprint).items()
        ]
    frame = concat(rows)
    frame = frame.assign(source="bench") if not frame.empty else frame
    return frame, concat(traces), pd.DataFrame(prints, columns=["task", "key", "value"])


def load_baseline(root: Path, tasks: list[str], log: MissingLog) -> tuple[pd.DataFrame, ...]:
    """External-engine rows, plus which engines ran (or why not) and their aggregate tokens/s."""
    rows, engines, throughput = [], [], []
    for task in tasks:
        base = f"results/baseline/{task}"
        frame, problem = read_csv(root / f"{base}.csv", ROW_COLUMNS)
        log.add(f"{base}.csv", problem, "baseline", optional=True)
        if not frame.empty:
            frame = numeric_rows(frame, f"{base}.csv", "baseline", log)
            rows.append(frame.assign(task=task, source="baseline"))
        meta, problem = read_json(root / f"{base}.json")
        if problem is not None:
            log.add(f"{base}.json", problem, "baseline", optional=True)
            continue
        for engine, status in (meta.get("engines") or {}).items():
            status = status if isinstance(status, dict) else {"status": str(status)}
            state = str(status.get("status", "unknown"))
            detail = status.get("reason") or status.get("error") or ""
            if isinstance(status.get("identical_to_setdiff"), int) and engine != "setdiff":
                same = f"identical to our AR: {status['identical_to_setdiff']}/{status.get('n')}"
                detail = f"{detail}; {same}" if detail else same
            engines.append({"task": task, "engine": engine, "status": state, "detail": detail})
            if state != "ran":
                why = f"{state}: {detail}" if detail else state
                log.add(f"{base}.json#{engine}", why, "baseline", optional=True)
            for concurrency, rate in (status.get("throughput") or {}).items():
                throughput.append(
                    {
                        "task": task,
                        "engine": engine,
                        "concurrency": int(concurrency),
                        "tokens_per_second": rate,
                    }
                )
    return concat(rows), pd.DataFrame(engines), pd.DataFrame(throughput)
