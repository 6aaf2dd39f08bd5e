"""Artifacts of one run -> tidy DataFrames, and an exact list of what is missing.

`load_run(root)` reads, relative to the run root: ``results/bench/<task>.{csv,json,traces.jsonl}``,
``results/baseline/<task>.csv``, ``metrics/tradeoff/<task>.json``,
``metrics/{evaluate,train,curve,textgen}/<task>/<paradigm>.json``, ``models/<task>/<paradigm>/
train_log.jsonl``, ``results/textgen/<task>/<paradigm>.csv``, ``ablations/<task>/trials.csv``,
``metrics/{backbone,seeds}/<task>.json``,
``params.yaml`` and ``dvc.lock`` (the per-example row files through `reports.inputs.rows`).
What should exist comes from ``params.yaml`` (``study``, ``bench``) joined with what is on disk.

Nothing here raises on a bad input: a missing, empty, unreadable or partial file becomes a
`Missing` record (path, problem, kind) and the matching frame is empty or partial, so the report
can say exactly what it could not show. No figures, no statistics, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from reports.inputs.files import (
    flatten_dict,
    read_csv,
    read_json,
    read_jsonl,
    read_metrics,
    read_yaml,
)
from reports.inputs.missing import Missing, MissingLog, concat
from reports.inputs.optuna import flatten_study
from reports.inputs.rows import ROW_COLUMNS, load_baseline, load_bench
from reports.inputs.tradeoff import flatten_tradeoff

__all__ = ["KINDS", "Expected", "Missing", "Run", "flatten_metrics", "load_run"]

TRIAL_COLUMNS = ("number", "state", "accuracy", "tokens_per_second")


KINDS: dict[str, str] = {
    "bench": "results/bench/<task>.csv",
    "bench_meta": "results/bench/<task>.json",
    "traces": "results/bench/<task>.traces.jsonl",
    "baseline": "results/baseline/<task>.csv",
    "tradeoff": "metrics/tradeoff/<task>.json",
    "evaluate": "metrics/evaluate/<task>/<paradigm>.json",
    "train": "metrics/train/<task>/<paradigm>.json",
    "train_log": "models/<task>/<paradigm>/train_log.jsonl",
    "curve": "metrics/curve/<task>/<paradigm>.json",
    "textgen_rows": "results/textgen/<task>/<paradigm>.csv",
    "textgen": "metrics/textgen/<task>/<paradigm>.json",
    "trials": "ablations/<task>/trials.csv or ablations/<task>/<study>/study.json",
    "backbone": "metrics/backbone/<task>.json",
    "seeds": "metrics/seeds/<task>.json",
    "setsize": "metrics/setsize/<task>.json",
    "lossless": "metrics/lossless/<task>.json",
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
    seeds: pd.DataFrame
    """Seed variance: one row per (task, paradigm): seeds, accuracies, mean, sd, binomial_se."""
    setsize: pd.DataFrame
    """Set-size study: one row per (task, paradigm, set size): accuracy, window, steps."""
    lossless: pd.DataFrame
    """Lossless decoders: one row per (task, method) of the test prompts, with the validation
    choice (k, W, n_select) and the regime repeated on each row."""
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
    """Names of the ``<name><suffix>`` files in `path`; a name with a dot is a sidecar of another
    (``arith.select.csv``: the bench's validation rows), never a task or paradigm."""
    if not path.is_dir():
        return []
    stems = (p.name[: -len(suffix)] for p in path.iterdir() if p.name.endswith(suffix))
    return sorted(stem for stem in stems if "." not in stem)


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


def _per_model_json(
    root: Path, folder: str, tasks: list[str], paradigms: list[str], kind: str, log: MissingLog
) -> pd.DataFrame:
    records = []
    for task in tasks:
        for paradigm in paradigms:
            path = f"{folder}/{task}/{paradigm}.json"
            data, problem = read_metrics(root / path, kind)
            log.add(path, problem, kind)
            if problem is None:
                records.append({**flatten_dict(data), "task": task, "paradigm": paradigm})
    return pd.DataFrame(records)


def _load_train_logs(root: Path, expect: Expected, log: MissingLog) -> pd.DataFrame:
    """The training logs, with each evaluation's answer accuracy from the curve stage (a log
    of a run before that stage may carry its own)."""
    frames = []
    for task in expect.tasks:
        for paradigm in expect.paradigms:
            path = f"models/{task}/{paradigm}/train_log.jsonl"
            records, problem = read_jsonl(root / path)
            log.add(path, problem, "train_log")
            curve_path = f"metrics/curve/{task}/{paradigm}.json"
            curve, problem = read_metrics(root / curve_path, "curve")
            log.add(curve_path, problem, "curve", optional=True)
            points = curve.get("points") if isinstance(curve, dict) else None
            if records:
                frame = pd.DataFrame(records).assign(task=task, paradigm=paradigm)
                if points:
                    accuracy = {p["step"]: p["accuracy"] for p in points}
                    frame["accuracy"] = frame["step"].map(accuracy)
                frames.append(frame)
    return concat(frames)


def _load_textgen(
    root: Path, expect: Expected, log: MissingLog
) -> tuple[pd.DataFrame, pd.DataFrame]:
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
    return concat(frames), metrics


def _load_trials(root: Path, expect: Expected, log: MissingLog) -> pd.DataFrame:
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
    return concat(frames)


def _study_files(
    root: Path, params: dict[str, Any], log: MissingLog, study: str, why: str
) -> Iterator[tuple[str, Any]]:
    """(task, parsed JSON) of ``metrics/<study>/<task>.json`` for the tasks ``study.<study>``
    lists or that exist; `why` is logged (optional) when there are none."""
    tasks = _union(_get(params, f"study.{study}") or [], _stems(root / f"metrics/{study}", ".json"))
    if not tasks:
        log.add(f"metrics/{study}/", why, study, optional=True)
    for task in tasks:
        path = f"metrics/{study}/{task}.json"
        data, problem = read_metrics(root / path, study)
        log.add(path, problem, study)
        yield task, data if isinstance(data, dict) else {}


def _dict_rows(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rows = data.get(key)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _load_backbone(root: Path, params: dict[str, Any], log: MissingLog) -> pd.DataFrame:
    """``metrics/backbone/<task>.json`` of the tasks the study lists or that exist."""
    why = "not found (the backbone stage has not run)"
    records = []
    for task, data in _study_files(root, params, log, "backbone", why):
        for row in _dict_rows(data, "rows"):
            flat = {k: v for k, v in row.items() if not isinstance(v, dict)}
            records.append({"task": task, "n_examples": data.get("n_examples"), **flat})
    return pd.DataFrame(records)


def _load_seeds(root: Path, params: dict[str, Any], log: MissingLog) -> pd.DataFrame:
    """``metrics/seeds/<task>.json`` of the tasks the study lists or that exist."""
    why = "not run (study.seeds empty; see params/seeds.yaml)"
    records = []
    for task, data in _study_files(root, params, log, "seeds", why):
        paradigms = data.get("paradigms")
        for paradigm, row in (paradigms if isinstance(paradigms, dict) else {}).items():
            if isinstance(row, dict):
                n = data.get("n_examples")
                records.append({"task": task, "paradigm": paradigm, "n_examples": n, **row})
    return pd.DataFrame(records)


def _load_setsize(root: Path, params: dict[str, Any], log: MissingLog) -> pd.DataFrame:
    """``metrics/setsize/<task>.json`` of the tasks the study lists or that exist; each row with
    the main run's own set size and window of its paradigm (``main_set_size``, ``main_window``)."""
    records = []
    for task, data in _study_files(root, params, log, "setsize", "not run (study.setsize empty)"):
        main = data.get("main") if isinstance(data.get("main"), dict) else {}
        for row in _dict_rows(data, "rows"):
            own = main.get(row.get("paradigm")) or {}
            extra = {"main_set_size": own.get("set_size"), "main_window": own.get("window")}
            records.append({"task": task, **row, **extra})
    return pd.DataFrame(records)


def _load_lossless(root: Path, params: dict[str, Any], log: MissingLog) -> pd.DataFrame:
    """``metrics/lossless/<task>.json`` of the tasks the study lists or that exist."""
    why = "not run (study.lossless empty)"
    records = []
    for task, data in _study_files(root, params, log, "lossless", why):
        figures = data.get("figures") if isinstance(data.get("figures"), dict) else {}
        choice = data.get("selection") if isinstance(data.get("selection"), dict) else {}
        regime = data.get("regime") if isinstance(data.get("regime"), dict) else {}
        for method, row in figures.items():
            if not isinstance(row, dict):
                continue
            flat = {k: v for k, v in row.items() if not isinstance(v, dict)}
            for key in ("speedup_vs_ar", "speedup_vs_best"):
                ratio = row.get(key) if isinstance(row.get(key), dict) else {}
                ci = ratio.get("ci95") if isinstance(ratio.get("ci95"), list) else [None, None]
                flat |= {key: ratio.get("estimate"), f"{key}_lo": ci[0], f"{key}_hi": ci[1]}
                flat |= (
                    {f"{key}_baseline": ratio.get("baseline")} if key == "speedup_vs_best" else {}
                )
            records.append(
                {
                    "task": task,
                    "method": method,
                    **flat,
                    "chosen_k": choice.get("draft_tokens"),
                    "chosen_w": choice.get("window"),
                    "n_select": choice.get("n"),
                    "threads": regime.get("threads"),
                    "device": regime.get("device"),
                }
            )
    return pd.DataFrame(records)


def _load_lmeval(root: Path, params: dict[str, Any], log: MissingLog) -> pd.DataFrame:
    """``metrics/lmeval/<task>/summary.json`` of the tasks params list or that exist."""
    tasks = _union(_get(params, "lmeval.tasks") or [], _subdirs(root / "metrics/lmeval"))
    if not tasks:
        log.add("metrics/lmeval/", "not found (the lmeval stage has not run)", "lmeval", True)
    records = []
    for task in tasks:
        path = f"metrics/lmeval/{task}/summary.json"
        data, problem = read_metrics(root / path, "lmeval")
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


def _load_lock(root: Path, log: MissingLog) -> pd.DataFrame:
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


def _load_batched(root: Path, expect: Expected, log: MissingLog) -> pd.DataFrame:
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
        best = data.get("against_best_ar") if isinstance(data, dict) else None
        best = best if isinstance(best, dict) else {}
        for row in figures or []:
            if isinstance(row, dict):
                records.append({"task": task, **row, **_best_ar(best.get(row.get("method")), row)})
    return pd.DataFrame(records)


def _best_ar(against: object, row: dict[str, Any]) -> dict[str, Any]:
    """A method's row against the fastest AR engine at its batch size (the bench stage's
    ``against_best_ar``): that ratio and engine, and the crossover batch sizes (None: the ratio
    never fell below 1 in the sweep), overall and per engine."""
    if not isinstance(against, dict):
        return {}
    size = str(row.get("batch_size"))
    ratios, engines = against.get("ratio_to_best_ar") or {}, against.get("best_ar") or {}
    return {
        "best_ar_ratio": ratios.get(size),
        "best_ar_engine": engines.get(size),
        "crossover": against.get("crossover"),
        "crossover_vs": against.get("crossover_vs") or {},
    }


def _load_tradeoff(root: Path, expect: Expected, log: MissingLog) -> pd.DataFrame:
    records = []
    for task in expect.bench_tasks:
        path = f"metrics/tradeoff/{task}.json"
        data, problem = read_metrics(root / path, "tradeoff")
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
    log = MissingLog()
    params, problem = read_yaml(root / "params.yaml")
    log.add("params.yaml", problem, "params")
    params = params if isinstance(params, dict) else {}
    expect = expected_inputs(root, params)
    rows, traces, fingerprints = load_bench(root, expect.bench_tasks, expect.bench_paradigms, log)
    baseline, engines, throughput = load_baseline(root, expect.bench_tasks, log)
    evaluate = _per_model_json(
        root, "metrics/evaluate", expect.tasks, expect.paradigms, "evaluate", log
    )
    train = _per_model_json(root, "metrics/train", expect.tasks, expect.paradigms, "train", log)
    textgen_rows, textgen = _load_textgen(root, expect, log)
    return Run(
        root=root,
        rows=concat([rows, baseline]),
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
        seeds=_load_seeds(root, params, log),
        setsize=_load_setsize(root, params, log),
        lossless=_load_lossless(root, params, log),
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
