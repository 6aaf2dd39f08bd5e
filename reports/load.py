"""Artifacts of one run -> tidy DataFrames, and an exact list of what is missing.

`load_run(root)` reads, relative to the run root: ``results/bench/<task>.{csv,json,traces.jsonl}``,
``results/baseline/<task>.csv``, ``metrics/tradeoff/<task>.json``,
``metrics/{evaluate,train,textgen}/<task>/<paradigm>.json``, ``models/<task>/<paradigm>/
train_log.jsonl``, ``results/textgen/<task>/<paradigm>.csv``, ``ablations/<task>/trials.csv``,
``params.yaml`` and ``dvc.lock``. What should exist comes from ``params.yaml`` (``study``,
``bench``) joined with what is found on disk.

Nothing here raises on a bad input: a missing, empty, unreadable or partial file becomes a
`Missing` record (path, problem, kind) and the matching frame is empty or partial, so the report
can say exactly what it could not show. No figures, no statistics, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from reports.comparison import flatten_tradeoff
from reports.reader import flatten_dict, read_csv, read_json, read_jsonl, read_yaml
from reports.study import flatten_study

ROW_COLUMNS = ("paradigm", "engine", "config", "example", "new_tokens", "nfe", "latency_s", "exact")
"""Columns a results row file must have to be used at all."""

TRIAL_COLUMNS = ("number", "state", "accuracy", "tokens_per_second")


@dataclasses.dataclass(frozen=True, slots=True)
class Missing:
    """One input the report could not use (or could use only in part)."""

    path: str
    """Path relative to the run root (``file#section`` for a section of a JSON file)."""
    problem: str
    """What is wrong: ``not found``, ``empty``, ``unreadable: ...``, ``no rows for ...``."""
    kind: str
    """Input kind (`KINDS` key): which figures and tables depend on it."""
    optional: bool = False
    """True for inputs the pipeline does not always produce (external baselines, ablations)."""


KINDS: dict[str, str] = {
    "bench": "results/bench/<task>.csv",
    "bench_meta": "results/bench/<task>.json",
    "traces": "results/bench/<task>.traces.jsonl",
    "baseline": "results/baseline/<task>.csv",
    "tradeoff": "metrics/tradeoff/<task>.json",
    "evaluate": "metrics/evaluate/<task>/<paradigm>.json",
    "train": "metrics/train/<task>/<paradigm>.json",
    "train_log": "models/<task>/<paradigm>/train_log.jsonl",
    "textgen_rows": "results/textgen/<task>/<paradigm>.csv",
    "textgen": "metrics/textgen/<task>/<paradigm>.json",
    "trials": "ablations/<task>/trials.csv or ablations/<task>/<study>/study.json",
    "backbone": "metrics/backbone/<task>.json",
    "lmeval": "metrics/lmeval/<task>/summary.json",
    "batched": "results/throughput/<task>.json",
    "params": "params.yaml",
    "lock": "dvc.lock",
}


@dataclasses.dataclass(slots=True)
class Run:
    """Everything one run's report reads, as tidy frames (empty frames where inputs are missing)."""

    root: Path
    rows: pd.DataFrame
    """Bench and baseline rows: one per example x configuration; ``source`` = bench | baseline."""
    engines: pd.DataFrame
    """Baseline engines per task: engine, status (``ran`` or why not), detail."""
    throughput: pd.DataFrame
    """Aggregate tokens/s of an engine at each concurrency (throughput regime), when reported."""
    traces: pd.DataFrame
    """One row per decode trace: task, paradigm, config, example, prompt_tokens, steps."""
    fingerprints: pd.DataFrame
    """task, key, value: the bench fingerprint (device, versions, revision, hashes)."""
    comparisons: pd.DataFrame
    """Flattened metrics/tradeoff: one row per comparison (speedup, CI, configs, or missing)."""
    evaluate: pd.DataFrame
    train: pd.DataFrame
    train_log: pd.DataFrame
    textgen_rows: pd.DataFrame
    textgen: pd.DataFrame
    trials: pd.DataFrame
    backbone: pd.DataFrame
    """The backbone study: one row per (task, variant), accuracies as the stage wrote them."""
    lmeval: pd.DataFrame
    """lm-eval vs our scorer: one row per (task, engine), as the lmeval stage wrote them."""
    batched: pd.DataFrame
    """Throughput regime: tokens/s of each method at each batch size (bench stage sweep)."""
    lock: pd.DataFrame
    """stage, kind (dep/out), path, md5 from dvc.lock."""
    params: dict[str, Any]
    missing: list[Missing]

    @property
    def preset(self) -> str | None:
        """The active params preset (``params.yaml`` key ``preset``)."""
        value = self.params.get("preset")
        return None if value is None else str(value)


# --- what the run should contain --------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """Tasks and paradigms the run should cover: params.yaml joined with what is on disk."""

    tasks: list[str]
    paradigms: list[str]
    bench_tasks: list[str]
    bench_paradigms: list[str]
    textgen_tasks: list[str]
    ablation_tasks: list[str]


def _subdirs(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def _stems(path: Path, suffix: str) -> list[str]:
    if not path.is_dir():
        return []
    return sorted(p.name[: -len(suffix)] for p in path.iterdir() if p.name.endswith(suffix))


def _union(*lists: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for items in lists:
        out += [str(i) for i in items if str(i) not in out]
    return out


def _get(params: dict[str, Any], dotted: str) -> Any:
    node: Any = params
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def expected_inputs(root: Path, params: dict[str, Any]) -> Expected:
    """The tasks/paradigms to look for, from ``params.yaml`` and the directories present."""
    found_tasks = [_subdirs(root / d) for d in ("metrics/evaluate", "metrics/train", "models")]
    tasks = _union(_get(params, "study.tasks") or [], *found_tasks)
    found_paradigms = [_stems(root / "metrics/evaluate" / t, ".json") for t in tasks]
    paradigms = _union(_get(params, "study.paradigms") or [], *found_paradigms)
    bench_tasks = _union(
        _get(params, "bench.tasks") or [],
        _stems(root / "results/bench", ".csv"),
        _stems(root / "results/bench", ".json"),
    )
    sweep = _get(params, "bench.sweep")
    textgen_tasks = _union(
        _get(params, "study.textgen") or [],
        _subdirs(root / "results/textgen"),
        _subdirs(root / "metrics/textgen"),
    )
    return Expected(
        tasks=tasks,
        paradigms=paradigms,
        bench_tasks=bench_tasks,
        bench_paradigms=list(sweep) if isinstance(sweep, dict) else paradigms,
        textgen_tasks=textgen_tasks,
        ablation_tasks=_union(_get(params, "study.ablate") or [], _subdirs(root / "ablations")),
    )


# --- loaders per input kind -------------------------------------------------------------------


class _Log:
    """Collects `Missing` records while loading."""

    def __init__(self) -> None:
        self.items: list[Missing] = []

    def add(self, path: str, problem: str | None, kind: str, optional: bool = False) -> None:
        if problem is not None:
            self.items.append(Missing(path, problem, kind, optional))


def _check_rows(
    frame: pd.DataFrame,
    path: str,
    paradigms: list[str],
    configurations: list[tuple[str, str]],
    log: _Log,
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


def _load_bench(root: Path, expect: Expected, log: _Log) -> tuple[pd.DataFrame, ...]:
    rows, traces, prints = [], [], []
    for task in expect.bench_tasks:
        base = f"results/bench/{task}"
        meta, problem = read_json(root / f"{base}.json")
        log.add(f"{base}.json", problem, "bench_meta")
        meta = meta if isinstance(meta, dict) else {}
        declared = [(c.get("paradigm"), c.get("config")) for c in meta.get("configurations", [])]
        frame, problem = read_csv(root / f"{base}.csv", ROW_COLUMNS)
        log.add(f"{base}.csv", problem, "bench")
        if not frame.empty:
            frame = _numeric_rows(frame, f"{base}.csv", "bench", log)
            frame["task"] = task
            _check_rows(frame, f"{base}.csv", expect.bench_paradigms, declared, log)
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
    frame = _concat(rows)
    frame = frame.assign(source="bench") if not frame.empty else frame
    return frame, _concat(traces), pd.DataFrame(prints, columns=["task", "key", "value"])


def _load_baseline(root: Path, expect: Expected, log: _Log) -> tuple[pd.DataFrame, ...]:
    """External-engine rows, plus which engines ran (or why not) and their aggregate tokens/s."""
    rows, engines, throughput = [], [], []
    for task in expect.bench_tasks:
        base = f"results/baseline/{task}"
        frame, problem = read_csv(root / f"{base}.csv", ROW_COLUMNS)
        log.add(f"{base}.csv", problem, "baseline", optional=True)
        if not frame.empty:
            frame = _numeric_rows(frame, f"{base}.csv", "baseline", log)
            rows.append(frame.assign(task=task, source="baseline"))
        meta, problem = read_json(root / f"{base}.json")
        if problem is not None:
            log.add(f"{base}.json", problem, "baseline", optional=True)
            continue
        for engine, status in (meta.get("engines") or {}).items():
            status = status if isinstance(status, dict) else {"status": str(status)}
            state = str(status.get("status", "unknown"))
            detail = status.get("reason") or status.get("error") or ""
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
    return _concat(rows), pd.DataFrame(engines), pd.DataFrame(throughput)


NUMERIC_COLUMNS = ("example", "new_tokens", "nfe", "latency_s", "exact", "score", "peak_mem_mb")


def _numeric_rows(frame: pd.DataFrame, path: str, kind: str, log: _Log) -> pd.DataFrame:
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


def _valid_traces(trace: pd.DataFrame, path: str, log: _Log) -> pd.DataFrame:
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


def _check_traces(rows: pd.DataFrame, trace: pd.DataFrame, path: str, log: _Log) -> None:
    if rows.empty:
        return
    ours = rows[rows["engine"] == "setdiff"]
    want = set(zip(ours["paradigm"], ours["config"], strict=True))
    have = set(zip(trace["paradigm"], trace["config"], strict=True))
    lost = sorted(want - have)
    if lost:
        log.add(path, "no traces for: " + ", ".join(f"{p} {c!r}" for p, c in lost), "traces")


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _per_model_json(
    root: Path, folder: str, tasks: list[str], paradigms: list[str], kind: str, log: _Log
) -> pd.DataFrame:
    records = []
    for task in tasks:
        for paradigm in paradigms:
            path = f"{folder}/{task}/{paradigm}.json"
            data, problem = read_json(root / path)
            if problem is None and not isinstance(data, dict):
                problem = "unreadable: not a JSON object"
            log.add(path, problem, kind)
            if problem is None:
                records.append({**flatten_dict(data), "task": task, "paradigm": paradigm})
    return pd.DataFrame(records)


def _load_train_logs(root: Path, expect: Expected, log: _Log) -> pd.DataFrame:
    frames = []
    for task in expect.tasks:
        for paradigm in expect.paradigms:
            path = f"models/{task}/{paradigm}/train_log.jsonl"
            records, problem = read_jsonl(root / path)
            log.add(path, problem, "train_log")
            if records:
                frames.append(pd.DataFrame(records).assign(task=task, paradigm=paradigm))
    return _concat(frames)


def _load_textgen(root: Path, expect: Expected, log: _Log) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not expect.textgen_tasks:
        problem = "not found (the textgen stage has not run)"
        log.add("results/textgen/", problem, "textgen_rows", optional=True)
        log.add("metrics/textgen/", problem, "textgen", optional=True)
        return pd.DataFrame(), pd.DataFrame()
    frames = []
    for task in expect.textgen_tasks:
        for paradigm in expect.paradigms:
            path = f"results/textgen/{task}/{paradigm}.csv"
            frame, problem = read_csv(root / path, ROW_COLUMNS)
            log.add(path, problem, "textgen_rows")
            frames.append(frame.assign(task=task) if not frame.empty else frame)
    metrics = _per_model_json(
        root, "metrics/textgen", expect.textgen_tasks, expect.paradigms, "textgen", log
    )
    return _concat(frames), metrics


def _load_trials(root: Path, expect: Expected, log: _Log) -> pd.DataFrame:
    """Ablation trials: ``ablations/<task>/trials.csv`` and every ``<study>/study.json``."""
    frames = []
    for task in expect.ablation_tasks:
        path = f"ablations/{task}/trials.csv"
        frame, csv_problem = read_csv(root / path, TRIAL_COLUMNS)
        if csv_problem != "not found":
            log.add(path, csv_problem, "trials")
        if not frame.empty:
            if "is_pareto" in frame.columns:
                frame["is_pareto"] = frame["is_pareto"].astype(str).str.lower() == "true"
            frames.append(frame.assign(task=task))
        exports = sorted((root / "ablations" / task).glob("*/study.json"))
        for export in exports:
            data, problem = read_json(export)
            trials = flatten_study(data) if isinstance(data, dict) else pd.DataFrame()
            relative = export.relative_to(root).as_posix()
            log.add(relative, problem or (None if len(trials) else "empty (no trials)"), "trials")
            frames.append(trials.assign(task=task) if len(trials) else trials)
        if csv_problem == "not found" and not exports:
            why = "not found: no trials.csv or <study>/study.json (the ablation flow has not run)"
            log.add(f"ablations/{task}/", why, "trials", optional=True)
    return _concat(frames)


def _load_backbone(root: Path, params: dict[str, Any], log: _Log) -> pd.DataFrame:
    """``metrics/backbone/<task>.json`` of the tasks the study lists or that exist."""
    tasks = _union(_get(params, "study.backbone") or [], _stems(root / "metrics/backbone", ".json"))
    if not tasks:
        log.add("metrics/backbone/", "not found (the backbone stage has not run)", "backbone", True)
    records = []
    for task in tasks:
        path = f"metrics/backbone/{task}.json"
        data, problem = read_json(root / path)
        log.add(path, problem, "backbone")
        rows = data.get("rows") if isinstance(data, dict) else None
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict):
                flat = {k: v for k, v in row.items() if not isinstance(v, dict)}
                records.append({"task": task, "n_examples": data.get("n_examples"), **flat})
    return pd.DataFrame(records)


def _load_lmeval(root: Path, params: dict[str, Any], log: _Log) -> pd.DataFrame:
    """``metrics/lmeval/<task>/summary.json`` of the tasks params list or that exist."""
    tasks = _union(_get(params, "lmeval.tasks") or [], _subdirs(root / "metrics/lmeval"))
    if not tasks:
        log.add("metrics/lmeval/", "not found (the lmeval stage has not run)", "lmeval", True)
    records = []
    for task in tasks:
        path = f"metrics/lmeval/{task}/summary.json"
        data, problem = read_json(root / path)
        log.add(path, problem, "lmeval")
        engines = data.get("engines") if isinstance(data, dict) else None
        for engine, row in (engines if isinstance(engines, dict) else {}).items():
            if isinstance(row, dict):
                flat = {k: v for k, v in row.items() if not isinstance(v, dict | list)}
                records.append({"task": task, "engine": engine, **flat})
                if row.get("status") != "ran":
                    why = f"{engine} {row.get('status')}: {row.get('reason', '')}"
                    log.add(f"{path}#{engine}", why, "lmeval", True)
    return pd.DataFrame(records)


def _load_lock(root: Path, log: _Log) -> pd.DataFrame:
    lock, problem = read_yaml(root / "dvc.lock")
    log.add("dvc.lock", problem, "lock")
    records = []
    for stage, body in ((lock or {}).get("stages") or {}).items():
        for kind in ("deps", "outs"):
            for entry in (body or {}).get(kind) or []:
                digest = entry.get("md5") or entry.get("hash") or ""
                path = entry.get("path")
                records.append({"stage": stage, "kind": kind[:-1], "path": path, "md5": digest})
    return pd.DataFrame(records, columns=["stage", "kind", "path", "md5"])


def _load_batched(root: Path, expect: Expected, log: _Log) -> pd.DataFrame:
    """The bench stage's throughput sweep (`results/throughput/<task>.json`), one row per
    (method, batch size); a sweep that was off is listed as missing, optional."""
    records = []
    for task in expect.bench_tasks:
        path = f"results/throughput/{task}.json"
        data, problem = read_json(root / path)
        figures = data.get("figures") if isinstance(data, dict) else None
        if problem is None and not figures:
            problem = "the throughput sweep was off (bench.run.throughput)"
        log.add(path, problem, "batched", optional=True)
        records += [{"task": task, **row} for row in figures or [] if isinstance(row, dict)]
    return pd.DataFrame(records)


def _load_tradeoff(root: Path, expect: Expected, log: _Log) -> pd.DataFrame:
    records = []
    for task in expect.bench_tasks:
        path = f"metrics/tradeoff/{task}.json"
        data, problem = read_json(root / path)
        log.add(path, problem, "tradeoff")
        if isinstance(data, dict):
            for row in flatten_tradeoff(task, data):
                records.append(row)
                if row.get("missing"):
                    section = row["comparison"].replace(" ", "_")
                    log.add(f"{path}#{section}", f"missing: {row['missing']}", "tradeoff")
    return pd.DataFrame(records)


def load_run(root: Path | str) -> Run:
    """Read every artifact of the run at `root`; never raises for missing or bad inputs."""
    root = Path(root)
    log = _Log()
    params, problem = read_yaml(root / "params.yaml")
    log.add("params.yaml", problem, "params")
    params = params if isinstance(params, dict) else {}
    expect = expected_inputs(root, params)
    rows, traces, fingerprints = _load_bench(root, expect, log)
    baseline, engines, throughput = _load_baseline(root, expect, log)
    evaluate = _per_model_json(
        root, "metrics/evaluate", expect.tasks, expect.paradigms, "evaluate", log
    )
    train = _per_model_json(root, "metrics/train", expect.tasks, expect.paradigms, "train", log)
    textgen_rows, textgen = _load_textgen(root, expect, log)
    return Run(
        root=root,
        rows=_concat([rows, baseline]),
        engines=engines,
        throughput=throughput,
        traces=traces,
        fingerprints=fingerprints,
        comparisons=_load_tradeoff(root, expect, log),
        evaluate=evaluate,
        train=train,
        train_log=_load_train_logs(root, expect, log),
        textgen_rows=textgen_rows,
        textgen=textgen,
        trials=_load_trials(root, expect, log),
        backbone=_load_backbone(root, params, log),
        lmeval=_load_lmeval(root, params, log),
        batched=_load_batched(root, expect, log),
        lock=_load_lock(root, log),
        params=params,
        missing=log.items,
    )


def flatten_metrics(root: Path | str) -> pd.DataFrame:
    """Every numeric leaf of every ``metrics/**/*.json`` (path, key, value), like `dvc metrics`."""
    root = Path(root)
    records = []
    for path in sorted((root / "metrics").rglob("*.json")):
        data, problem = read_json(path)
        if problem is not None or not isinstance(data, dict):
            continue
        for key, value in flatten_dict(data).items():
            if isinstance(value, list) and all(isinstance(v, int | float) for v in value):
                items = {f"{key}.{i}": v for i, v in enumerate(value)}
            else:
                items = {key: value}
            for name, leaf in items.items():
                if isinstance(leaf, int | float) and not isinstance(leaf, bool):
                    rel = path.relative_to(root).as_posix()
                    records.append({"path": rel, "key": name, "value": float(leaf)})
    return pd.DataFrame(records, columns=["path", "key", "value"])
