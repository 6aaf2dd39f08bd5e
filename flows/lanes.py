"""The fine-tunes side by side: the ``train`` stages through ``dvc repro``, several at a time.

``dvc repro`` runs one stage at a time. The fine-tunes (``train@<task>-<paradigm>``, about half
of a default run) only need their AR models, not each other. On the 2-core CI machine two
1-thread trainings side by side each step as fast as one alone, while a 2-thread step is only
1.3-1.4x faster than a 1-thread one, so two at a time they finish about 1.4x sooner. Weights do
not depend on the thread count (bit-identical at 1 and 2 threads), so this changes time only.

``python -m flows.lanes`` (``make run`` calls it before ``dvc repro``):

1. ``dvc repro`` of every stage the train stages depend on (one at a time, as DVC decides);
2. the train stages, `lanes` at a time, longest first (the committed ``metrics/train`` seconds,
   else the steps in params), each ``dvc --wait-for-lock repro --single-item <stage>``: DVC
   releases its repository lock while a stage's command runs and records each stage in
   ``dvc.lock`` as it ends. Each stage's output goes to ``.dvc/tmp/lanes/<stage>.log``; the
   terminal gets one line as each starts and ends.

Lanes default to the usable cores divided by the stages' largest ``threads``
(``train.<task>.diffusion``, or ``train.<task>.paradigms.<p>``; 0 = torch's default, all cores,
so one lane). A failed stage stops new ones from starting; the running ones finish and are
recorded; the run then exits 1 naming the stage and its log. What the lanes left is what
``dvc repro`` runs next, so plain ``dvc repro`` gives the same outputs, one stage at a time.
Orchestration only: no torch, no setdiff import; stages, edges and params are read from DVC and
``params.yaml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

GROUP = "train"
"""The foreach group whose stages run side by side."""
DVC = (sys.executable, "-m", "dvc")
LOG_DIR = Path(".dvc") / "tmp" / "lanes"
_EDGE = re.compile(r'^"(?P<up>[^"]+)" -> "(?P<down>[^"]+)";$')


class LaneError(RuntimeError):
    """A plan that cannot run (a train stage depending on another, oversubscribed cores)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    upstream: tuple[str, ...]
    """Stages the train stages depend on, reproduced first, one at a time."""
    stages: tuple[str, ...]
    """The train stages, longest first."""
    lanes: int


def cores() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def edges_from_dot(dot: str) -> list[tuple[str, str]]:
    """(upstream, downstream) pairs of ``dvc dag --dot``."""
    found = (_EDGE.match(line.strip()) for line in dot.splitlines())
    return [(m["up"], m["down"]) for m in found if m]


def stage_threads(params: Mapping[str, Any], stage: str) -> int:
    """`threads` of ``train@<task>-<paradigm>`` as its stage resolves it (0 = all cores)."""
    task, paradigm = stage.split("@", 1)[1].split("-", 1)
    recipe = params.get("train", {}).get(task, {})
    override = (recipe.get("paradigms") or {}).get(paradigm) or {}
    return int(override.get("threads", (recipe.get("diffusion") or {}).get("threads", 0)))


def stage_cost(root: Path, params: Mapping[str, Any], stage: str) -> tuple[float, float]:
    """Sort key, larger first: the last recorded training seconds, then the steps in params."""
    task, paradigm = stage.split("@", 1)[1].split("-", 1)
    recipe = params.get("train", {}).get(task, {})
    override = (recipe.get("paradigms") or {}).get(paradigm) or {}
    steps = float(override.get("steps", (recipe.get("diffusion") or {}).get("steps", 0)))
    metrics = root / "metrics" / "train" / task / f"{paradigm}.json"
    try:
        seconds = float(json.loads(metrics.read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        seconds = 0.0
    return seconds, steps


def plan(
    names: Sequence[str],
    edges: Sequence[tuple[str, str]],
    threads: Mapping[str, int],
    costs: Mapping[str, tuple[float, float]],
    n_cores: int,
    lanes: int | None = None,
) -> Plan:
    """What runs first, what runs side by side, and how many at a time."""
    stages = [n for n in names if n.startswith(f"{GROUP}@")]
    ups: dict[str, set[str]] = {}
    for up, down in edges:
        ups.setdefault(down, set()).add(up)
    upstream: set[str] = set()
    for stage in stages:
        todo = list(ups.get(stage, ()))
        while todo:
            node = todo.pop()
            if node in stages:
                raise LaneError(f"{stage} depends on {node}: train stages must be independent")
            if node not in upstream:
                upstream.add(node)
                todo.extend(ups.get(node, ()))
    widest = max((threads[s] or n_cores for s in stages), default=1)
    if lanes is None:
        lanes = max(1, n_cores // widest)
    elif lanes < 1:
        raise LaneError(f"--lanes must be >= 1, got {lanes}")
    elif lanes > 1 and lanes * widest > n_cores:
        raise LaneError(
            f"--lanes {lanes} x {widest} threads (train.<task>.diffusion.threads) > {n_cores} "
            "cores: oversubscribed trainings run many times slower; lower one of them"
        )
    ordered = sorted(stages, key=lambda s: costs[s], reverse=True)
    return Plan(tuple(n for n in names if n in upstream), tuple(ordered), lanes)


def run_lanes(stages: Sequence[str], lanes: int, root: Path, dvc: Sequence[str] = DVC) -> list[str]:
    """Run `stages` `lanes` at a time; returns the ones that failed (none started after one)."""
    log_dir = root / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    lock = threading.Lock()
    free = list(range(lanes, 0, -1))

    def one(stage: str) -> None:
        with lock:
            if failed:
                return
            lane = free.pop()
        log = log_dir / f"{stage}.log"
        _say(f"[{lane}] {stage}: started (log {LOG_DIR / log.name})")
        began = time.monotonic()
        with log.open("w") as out:
            argv = [*dvc, "--wait-for-lock", "repro", "--single-item", stage]
            code = subprocess.run(argv, cwd=root, stdout=out, stderr=subprocess.STDOUT).returncode
        minutes = (time.monotonic() - began) / 60
        with lock:
            free.append(lane)
            if code == 0:
                skipped = "didn't change, skipping" in log.read_text(errors="replace")
                what = "up to date" if skipped else f"done in {minutes:.1f} min"
                _say(f"[{lane}] {stage}: {what}")
            else:
                failed.append(stage)
                _say(f"[{lane}] {stage}: failed (exit {code}): {_last_line(log)}")

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        for future in [pool.submit(one, s) for s in stages]:
            future.result()
    return failed


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def _say(message: str) -> None:
    print(f"lanes: {message}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.lanes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default=".", type=Path)
    parser.add_argument("--lanes", type=int, help="stages at a time (default: cores / threads)")
    args = parser.parse_args(argv)
    root: Path = args.root
    params_path = root / "params.yaml"
    try:
        params = yaml.safe_load(params_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        print(f"lanes: {params_path}: {err}", file=sys.stderr)
        return 2
    names = _dvc(root, "stage", "list", "--name-only").split()
    edges = edges_from_dot(_dvc(root, "dag", "--dot"))
    stages = [n for n in names if n.startswith(f"{GROUP}@")]
    try:
        todo = plan(
            names,
            edges,
            {s: stage_threads(params, s) for s in stages},
            {s: stage_cost(root, params, s) for s in stages},
            cores(),
            args.lanes,
        )
    except (LaneError, ValueError, AttributeError) as err:
        print(f"lanes: {err}", file=sys.stderr)
        return 2
    if todo.upstream and subprocess.run([*DVC, "repro", *todo.upstream], cwd=root).returncode:
        print(f"lanes: dvc repro of {', '.join(todo.upstream)} failed", file=sys.stderr)
        return 1
    _say(f"{len(todo.stages)} {GROUP} stages, {todo.lanes} at a time on {cores()} cores")
    failed = run_lanes(todo.stages, todo.lanes, root)
    if failed:
        logs = ", ".join(str(LOG_DIR / f"{s}.log") for s in failed)
        print(f"lanes: {', '.join(failed)} failed; see {logs}", file=sys.stderr)
        return 1
    return 0


def _dvc(root: Path, *args: str) -> str:
    done = subprocess.run([*DVC, *args], cwd=root, check=True, capture_output=True, text=True)
    return done.stdout


if __name__ == "__main__":
    sys.exit(main())
