"""Headline numbers of a run (--write: record metrics/summary.json); ends make run.

``setdiff summary``: a run's headline numbers, in a few lines a person reads.

``setdiff summary --write`` (DVC stage ``summary``) reads, for the preset's tasks, each paradigm's
answer accuracy (``metrics/evaluate/<task>/<paradigm>.json``), setdlm's speedup over our AR
decoder with its 95% CI and the vLLM row (``metrics/tradeoff/<task>.json``; whether vLLM ran:
``results/baseline/<task>.json``), and writes them to ``metrics/summary.json``: the one file DVC
declares as metrics, flat enough that ``dvc metrics show`` and ``dvc metrics diff`` stay
readable (the detailed JSONs stay DVC outputs). ``setdiff summary`` prints that file and where
the report is; ``make run`` ends with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from metrics_schema import problems
from setdiff.config import ConfigError
from setdiff.files import write_json
from setdiff.paradigm import PARADIGMS
from setdiff.preset import Preset, load_preset

PARAMS: tuple[str, ...] = ("preset", "study.tasks", "study.paradigms", "bench.tasks")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

SUMMARY = Path("metrics/summary.json")
REPORT = Path("reports/out/report.md")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff summary",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--write", action="store_true", help=f"first compute {SUMMARY}")
    parser.add_argument("--params", default="params.yaml", help="params file (with --write)")
    parser.add_argument("--root", default=".", help="directory holding metrics/, results/")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.write:
        write_json(root / SUMMARY, build_summary(root, load_preset(args.params)))
    path = root / SUMMARY
    if not path.exists():
        raise ConfigError(f"{path} does not exist: run the pipeline first (dvc repro)")
    print("\n".join(format_summary(json.loads(path.read_text()), root)))


def build_summary(root: Path, preset: Preset) -> dict[str, Any]:
    """``{"preset": ..., task: {"accuracy": {paradigm: value}, speed keys...}}``."""
    record: dict[str, Any] = {"preset": preset.name}
    bench_tasks = preset.section("bench.tasks")
    for task in preset.section("study").tasks:
        entry: dict[str, Any] = {}
        accuracy, without = {}, []
        for paradigm in preset.section("study").paradigms:
            path = root / "metrics" / "evaluate" / task / f"{paradigm}.json"
            metrics = _read(path, "evaluate")
            if "accuracy" in metrics:
                accuracy[paradigm] = metrics["accuracy"]
            else:
                without.append(path)
        if accuracy and without:  # never a headline that silently lacks a paradigm
            raise ConfigError(f"{without[0]}: field 'accuracy' missing ({task} has answers)")
        if accuracy:
            entry["accuracy"] = accuracy
        if task in bench_tasks:
            entry.update(_speed(root, task))
        if entry:
            record[task] = entry
    return record


def _speed(root: Path, task: str) -> dict[str, Any]:
    """setdlm over AR (tokens/s, CI) and the vLLM row: its ratios, or why it did not run."""
    tradeoff = _read(root / "metrics" / "tradeoff" / f"{task}.json", "tradeoff")
    entry: dict[str, Any] = {}
    headline = tradeoff.get("setdlm_vs_ar", {})
    if headline.get("speedup") is not None:
        low, high = headline["ci95"]
        entry.update(setdlm_speedup=headline["speedup"])
        entry.update(setdlm_speedup_ci_low=low, setdlm_speedup_ci_high=high)
    engines = tradeoff.get("ar_engines", {})
    vllm = [engines[key] for key in sorted(engines) if key.startswith("vllm:")]
    if not vllm:  # skipped (no vLLM on this machine) or failed: the baseline stage says which
        baseline = root / "results" / "baseline" / f"{task}.json"
        status = _read(baseline, None, required=False).get("engines", {}).get("vllm", {})
        return {**entry, "vllm": status.get("status", "not run")}
    low, high = vllm[0]["ci95"]
    entry.update(vllm_over_ar=vllm[0]["engine_over_own_ar"], vllm_ci_low=low, vllm_ci_high=high)
    if vllm[0].get("setdlm_vs_vllm") is not None:
        entry["setdlm_vs_vllm"] = vllm[0]["setdlm_vs_vllm"]
    return entry


def format_summary(record: dict[str, Any], root: Path) -> list[str]:
    """The lines `setdiff summary` prints (each under 100 characters)."""
    lines = [f"Headline numbers (preset {record.get('preset', '?')}, {SUMMARY}):"]
    for task, entry in record.items():
        if not isinstance(entry, dict):
            continue
        if "accuracy" in entry:
            ordered = sorted(entry["accuracy"].items(), key=lambda item: _rank(item[0]))
            values = "  ".join(f"{p} {v:.3f}" for p, v in ordered)
            lines.append(f"  {task:<6} accuracy  {values}")
        if "setdlm_speedup" in entry:
            ci = _ci(entry["setdlm_speedup_ci_low"], entry["setdlm_speedup_ci_high"])
            lines.append(f"  {task:<6} speed     setdlm {entry['setdlm_speedup']:.2f}x AR {ci}")
        if "vllm_over_ar" in entry:
            ci = _ci(entry["vllm_ci_low"], entry["vllm_ci_high"])
            row = f"vLLM {entry['vllm_over_ar']:.2f}x our AR {ci}"
            if "setdlm_vs_vllm" in entry:
                row += f"; setdlm {entry['setdlm_vs_vllm']:.2f}x vLLM"
            lines.append(f"  {task:<6} vLLM      {row}")
        elif "vllm" in entry:
            where = f"results/baseline/{task}.json"
            lines.append(f"  {task:<6} vLLM      {entry['vllm']} (see {where})")
    built = "" if (root / REPORT).exists() else " (not built yet)"
    lines.append(f"Report: {REPORT}{built}; HTML beside it (report.html)")
    return lines


def _rank(paradigm: str) -> int:
    """The study's order (ar first); the recorded JSON is sorted by name."""
    names = list(PARADIGMS)
    return names.index(paradigm) if paradigm in names else len(names)


def _ci(low: float | None, high: float | None) -> str:
    """The CI, or that it could not be computed (the tradeoff stage writes null then)."""
    if low is None or high is None:
        return "(95% CI not computed)"
    return f"(95% CI {low:.2f}-{high:.2f})"


def _read(path: Path, kind: str | None, *, required: bool = True) -> dict[str, Any]:
    """The JSON at `path`, checked against `kind`'s schema (`metrics_schema`) when given; a
    missing (if `required`), unparseable or invalid file is refused with one line naming it."""
    if not path.exists():
        if required:
            raise ConfigError(f"{path} is missing: run the stage that writes it (dvc repro)")
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}: not valid JSON ({err}): rerun the stage that writes it"
        ) from None
    found = problems(kind, data) if kind else []
    if found:
        raise ConfigError(f"{path}: {found[0]}: rerun the stage that writes it (dvc repro)")
    return data
