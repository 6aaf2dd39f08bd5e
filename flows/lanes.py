"""Every stage of ``dvc repro``, several at a time as the cores allow.

``dvc repro`` runs one stage at a time: on the 2-core CI machine one core idles through the
fine-tunes and through most of the evaluation that follows. ``python -m flows.lanes`` (``make
run`` calls it before ``dvc repro``, which then finds nothing to do) runs the same stages in
DAG order, as many at a time as their threads fit the usable cores:

- each stage takes its `threads` cores (`stage_threads`: the params keys its module declares
  in ``THREADS``, read with `ast`; 0 = torch's default, all cores); a stage that starts servers
  or worker pools of its own (``baseline``, ``lmeval``, ``ablate``) or that declares no threads
  runs alone;
- a stage starts once every stage upstream of it has ended; among those ready, the one with the
  longest chain of work behind it first (the committed ``metrics/train`` seconds, else
  `DEFAULT_SECONDS`), and a narrower one fills a core the first cannot use;
- each is ``dvc --wait-for-lock repro --single-item <stage>``: DVC releases its repository lock
  while a stage's command runs and records each stage in ``dvc.lock`` as it ends. Its output goes
  to ``.dvc/tmp/lanes/<stage>.log``; the terminal gets one line as each starts and ends, and
  at the end how busy the cores were; ``.dvc/tmp/lanes/timeline.json`` when each ran.

On 2 cores two 1-thread trainings side by side each step as fast as one alone, weights are
bit-identical at 1 and 2 threads, and every timed stage interleaves its methods per prompt (a
neighbour's load hits all of them alike), so the lanes change wall time, not results. A failed
stage starts nothing new; the running ones finish and are recorded; the run exits 1 naming the
stage and its log. Plain ``dvc repro`` gives the same outputs, one stage at a time.
Orchestration only: no torch, no setdiff import; stages, edges and params are read from DVC and
``params.yaml``, and each stage's ``THREADS`` from its module's source.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

DVC = (sys.executable, "-m", "dvc")
LOG_DIR = Path(".dvc") / "tmp" / "lanes"
ALONE = frozenset({"baseline", "lmeval", "ablate"})
"""Stage groups that start processes of their own (vLLM servers, Dask workers): all cores."""
STAGES = Path(__file__).resolve().parents[1] / "setdiff" / "stages"
"""The stage modules (``THREADS``, read with `ast` by `declared_threads`)."""
ONE = frozenset({"prepare", "tokenize", "floor", "tradeoff", "summary", "report"})
"""Stage groups that read and write files, single-threaded (no torch compute to speak of)."""
DEFAULT_SECONDS = 60.0
"""A stage's cost when no committed metrics say better (only the order of ties depends on it)."""
_EDGE = re.compile(r'^"(?P<up>[^"]+)" -> "(?P<down>[^"]+)";$')


class LaneError(RuntimeError):
    """A plan that cannot run (a cycle, a bad core count)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    order: tuple[str, ...]
    """Every stage, the longest chain of work behind it first."""
    ups: Mapping[str, frozenset[str]]
    """The stages each one waits for (its direct upstream)."""
    width: Mapping[str, int]
    """Cores each stage takes (1 .. cores)."""
    cores: int


def cores() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def edges_from_dot(dot: str) -> list[tuple[str, str]]:
    """(upstream, downstream) pairs of ``dvc dag --dot``."""
    found = (_EDGE.match(line.strip()) for line in dot.splitlines())
    return [(m["up"], m["down"]) for m in found if m]


def _split(stage: str) -> tuple[str, str, str]:
    """``group@task-paradigm`` -> (group, task, paradigm); missing parts are empty."""
    group, _, item = stage.partition("@")
    task, _, paradigm = item.partition("-")
    return group, task, paradigm


def declared_threads(stages: Path = STAGES) -> dict[str, tuple[str, ...]]:
    """Stage -> the params keys of the threads it computes on: the ``THREADS`` its module
    declares (``setdiff/stages/<stage>.py``), read with `ast` (this module imports no setdiff)."""
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted(stages.glob("*.py")):
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if not isinstance(node, ast.Assign):
                continue
            if any(isinstance(t, ast.Name) and t.id == "THREADS" for t in node.targets):
                found[path.stem] = tuple(ast.literal_eval(node.value))
    return found


def stage_threads(
    params: Mapping[str, Any], stage: str, threads: Mapping[str, tuple[str, ...]] | None = None
) -> int | None:
    """Threads `stage` runs on as its command resolves them (0 = all cores); None = alone.
    `threads`: `declared_threads` (read once by the caller; by default, here)."""
    group, task, paradigm = _split(stage)
    if group in ONE:
        return 1
    if group in ("train", "train_ar", "curve"):  # a curve decodes on its training's threads
        recipe = params.get("train", {}).get(task, {})
        if group == "train_ar" or paradigm == "ar":
            return int((recipe.get("ar") or {}).get("threads", 0))
        override = (recipe.get("paradigms") or {}).get(paradigm) or {}
        return int(override.get("threads", (recipe.get("diffusion") or {}).get("threads", 0)))
    keys = (declared_threads() if threads is None else threads).get(group)
    if keys:  # several: the widest (0, all cores, is the widest)
        widths = [int(_lookup(params, key) or 0) for key in keys]
        return 0 if 0 in widths else max(widths)
    return None


def _lookup(params: Mapping[str, Any], dotted: str) -> Any:
    """The value at `dotted` (``bench.run.threads``), or None where a key is missing."""
    node: Any = params
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def stage_seconds(root: Path, stage: str) -> float:
    """The last recorded training seconds of a train stage, else `DEFAULT_SECONDS`."""
    group, task, paradigm = _split(stage)
    if group not in ("train", "train_ar"):
        return DEFAULT_SECONDS
    metrics = root / "metrics" / "train" / task / f"{paradigm or 'ar'}.json"
    try:
        return float(json.loads(metrics.read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_SECONDS


def plan(
    names: Sequence[str],
    edges: Sequence[tuple[str, str]],
    threads: Mapping[str, int | None],
    seconds: Mapping[str, float],
    n_cores: int,
) -> Plan:
    """What waits for what, how wide each stage is, and who goes first."""
    if n_cores < 1:
        raise LaneError(f"--cores must be >= 1, got {n_cores}")
    known = set(names)
    ups: dict[str, set[str]] = {n: set() for n in names}
    downs: dict[str, set[str]] = {n: set() for n in names}
    for up, down in edges:
        if up in known and down in known:
            ups[down].add(up)
            downs[up].add(down)
    chain: dict[str, float] = {}

    def behind(node: str, path: frozenset[str]) -> float:
        if node in path:
            raise LaneError(f"the stages form a cycle through {node}")
        if node not in chain:
            tail = max((behind(d, path | {node}) for d in downs[node]), default=0.0)
            chain[node] = seconds.get(node, DEFAULT_SECONDS) + tail
        return chain[node]

    for n in names:
        behind(n, frozenset())
    width = {n: min(threads.get(n) or n_cores, n_cores) for n in names}
    order = sorted(names, key=lambda n: (-chain[n], names.index(n)))
    return Plan(tuple(order), {n: frozenset(u) for n, u in ups.items()}, width, n_cores)


def run_lanes(todo: Plan, root: Path, dvc: Sequence[str] = DVC) -> list[str]:
    """Run every stage of `todo` as its upstream ends and cores free; returns the failed ones
    (none starts after a failure)."""
    log_dir = root / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    timeline: list[dict[str, Any]] = []
    pending = list(todo.order)
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    done: set[str] = set()
    failed: list[str] = []
    free = todo.cores
    while running or (pending and not failed):
        for stage in [] if failed else list(pending):
            if todo.ups[stage] <= done and todo.width[stage] <= free:
                pending.remove(stage)
                free -= todo.width[stage]
                log = log_dir / f"{stage}.log"
                with log.open("w") as out:
                    argv = [*dvc, "--wait-for-lock", "repro", "--single-item", stage]
                    proc = subprocess.Popen(argv, cwd=root, stdout=out, stderr=subprocess.STDOUT)
                running[stage] = (proc, time.monotonic())
                _say(f"{stage}: started on {todo.width[stage]} of {todo.cores} cores")
        if not running:
            break  # what is pending waits for a stage that failed or never ran
        time.sleep(0.1)
        for stage, (proc, began) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[stage]
            free += todo.width[stage]
            log = log_dir / f"{stage}.log"
            ended = time.monotonic()
            if code == 0:
                done.add(stage)
                skipped = "didn't change, skipping" in log.read_text(errors="replace")
                status = "up to date" if skipped else "done"
                minutes = (ended - began) / 60
                _say(f"{stage}: {'up to date' if skipped else f'done in {minutes:.1f} min'}")
            else:
                failed.append(stage)
                status = f"failed (exit {code})"
                _say(f"{stage}: failed (exit {code}): {_last_line(log)}")
            timeline.append(
                {"stage": stage, "cores": todo.width[stage], "status": status}
                | {"start_s": round(began - t0, 1), "end_s": round(ended - t0, 1)}
            )
    _record(timeline, time.monotonic() - t0, todo.cores, log_dir / "timeline.json")
    return failed


def _record(timeline: list[dict[str, Any]], wall: float, n_cores: int, path: Path) -> None:
    """Write when each stage ran on how many cores (`path`) and say how busy the cores were."""
    busy = sum(row["cores"] * (row["end_s"] - row["start_s"]) for row in timeline)
    share = busy / (n_cores * wall) if wall > 0 else 1.0
    path.write_text(json.dumps({"cores": n_cores, "wall_s": round(wall, 1), "stages": timeline}))
    _say(
        f"{len(timeline)} stages in {wall / 60:.1f} min on {n_cores} cores: busy {share:.0%} "
        f"of it ({(n_cores * wall - busy) / 60:.1f} core-min idle); timeline in {path}"
    )


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
    parser.add_argument("--cores", type=int, help="cores to fill (default: the usable ones)")
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
    n_cores = cores() if args.cores is None else args.cores
    declared = declared_threads(root / "setdiff" / "stages")
    try:
        todo = plan(
            names,
            edges,
            {s: stage_threads(params, s, declared) for s in names},
            {s: stage_seconds(root, s) for s in names},
            n_cores,
        )
    except (LaneError, ValueError, AttributeError) as err:
        print(f"lanes: {err}", file=sys.stderr)
        return 2
    _say(f"{len(names)} stages on {n_cores} cores, each as its upstream ends")
    failed = run_lanes(todo, root)
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
