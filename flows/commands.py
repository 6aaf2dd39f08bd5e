"""The study's stage commands in order, without DVC: for a machine that has torch but not DVC.

    python -m flows.commands [--only S,...] [--skip S,...] [--run] [--root .]

Reads ``dvc.yaml`` and ``params.yaml`` (the active preset) with plain YAML, expands each stage's
``foreach`` / ``matrix`` as DVC does (``name@item``, ``name@task-paradigm``) and fills its
``${item}``, ``${item.key}`` and ``${params.path}`` references, orders the stages so that each
comes after every stage whose outputs it reads (the file's order otherwise), and prints one
command per stage, or runs them one after another (``--run``; the first failure stops the run
and names its stage). ``--only`` / ``--skip`` take stage names, with or without their ``@...``.

A GPU machine without DVC runs a preset's study this way: prepare the data on a CPU machine
(``dvc repro prepare tokenize``, or ``--only prepare,tokenize --run``), copy the repository with
its ``data/`` folder over, then ``python -m flows.commands --skip prepare,tokenize --run``
(``--skip ablate`` too where Optuna and Prefect are not installed). Nothing is recorded in
``dvc.lock``: back on a machine with DVC, ``dvc commit`` adopts the outputs.

Orchestration only: no torch, no setdiff import.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

_REF = re.compile(r"\$\{([^}]+)\}")


class CommandsError(ValueError):
    """dvc.yaml or params.yaml cannot be expanded (the message names the file and key)."""


def _lookup(path: str, scope: Mapping[str, Any], where: str) -> Any:
    value: Any = scope
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise CommandsError(f"{where}: ${{{path}}} names no value")
        value = value[key]
    return value


def _fill(value: Any, scope: Mapping[str, Any], where: str) -> Any:
    """`value` with every ``${...}`` reference resolved in `scope` (a whole-string reference
    keeps the referenced value's type: a foreach list stays a list)."""
    if isinstance(value, str):
        whole = _REF.fullmatch(value)
        if whole:
            return _lookup(whole.group(1), scope, where)
        return _REF.sub(lambda m: str(_lookup(m.group(1), scope, where)), value)
    if isinstance(value, list):
        return [_fill(v, scope, where) for v in value]
    if isinstance(value, dict):
        return {_fill(k, scope, where): _fill(v, scope, where) for k, v in value.items()}
    return value


def expand(dvc: Mapping[str, Any], params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every stage of `dvc` (a parsed dvc.yaml) as ``{name, cmd, deps, outs}``, in file order."""
    out = []
    for name, stage in (dvc.get("stages") or {}).items():
        where = f"dvc.yaml stages.{name}"
        if "foreach" in stage:
            items = _fill(stage["foreach"], params, where)
            if not isinstance(items, list):
                raise CommandsError(f"{where}.foreach: expected a list, got {items!r}")
            cases = [(f"{name}@{item}", item, stage["do"]) for item in items]
        elif "matrix" in stage:
            axes = {k: _fill(v, params, where) for k, v in stage["matrix"].items()}
            cases = [
                (f"{name}@{'-'.join(map(str, combo))}", dict(zip(axes, combo, strict=True)), stage)
                for combo in itertools.product(*axes.values())
            ]
        else:
            cases = [(name, None, stage)]
        for full, item, body in cases:
            scope = {**params, "item": item}
            cmd = body.get("cmd")
            if not isinstance(cmd, str):
                raise CommandsError(f"{where}: no cmd")
            out.append(
                {
                    "name": full,
                    "cmd": " ".join(_fill(cmd, scope, where).split()),
                    "deps": [str(_fill(d, scope, where)) for d in body.get("deps") or []],
                    "outs": [_path(_fill(o, scope, where)) for o in body.get("outs") or []],
                }
            )
    return out


def _path(entry: Any) -> str:
    """An ``outs`` entry's path (a string, or a one-key mapping of path -> options)."""
    return str(next(iter(entry))) if isinstance(entry, Mapping) else str(entry)


def _reads(dep: str, out: str) -> bool:
    return dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")


def ordered(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`stages` so that each follows every stage whose outputs it reads; file order otherwise."""
    before = {
        s["name"]: {
            t["name"]
            for t in stages
            if t is not s and any(_reads(d, o) for d in s["deps"] for o in t["outs"])
        }
        for s in stages
    }
    done: list[dict[str, Any]] = []
    left = list(stages)
    while left:
        ready = next((s for s in left if before[s["name"]] <= {d["name"] for d in done}), None)
        if ready is None:
            raise CommandsError(f"dvc.yaml: a cycle among {[s['name'] for s in left]}")
        done.append(ready)
        left.remove(ready)
    return done


def select(
    stages: list[dict[str, Any]], only: Sequence[str], skip: Sequence[str]
) -> list[dict[str, Any]]:
    """The stages named by `only` (all when empty) less those named by `skip`; a name matches
    a stage by its full name or the part before ``@``. An unknown name is refused."""
    known = {s["name"] for s in stages} | {s["name"].split("@")[0] for s in stages}
    for name in [*only, *skip]:
        if name not in known:
            bases = sorted({s["name"].split("@")[0] for s in stages})
            raise CommandsError(f"unknown stage {name!r}; stages: {', '.join(bases)} (or name@...)")

    def named(stage: dict[str, Any], names: Sequence[str]) -> bool:
        return stage["name"] in names or stage["name"].split("@")[0] in names

    return [s for s in stages if (not only or named(s, only)) and not named(s, skip)]


def _argv(cmd: str) -> list[str]:
    """A stage command's argv; ``setdiff`` is this Python's ``-m setdiff.cli`` where the
    console script is not installed."""
    argv = shlex.split(cmd)
    if argv[0] == "setdiff" and shutil.which("setdiff") is None:
        return [sys.executable, "-m", "setdiff.cli", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--only", default="", help="comma-separated stage names")
    parser.add_argument("--skip", default="", help="comma-separated stage names")
    parser.add_argument("--run", action="store_true", help="run the commands, in order")
    args = parser.parse_args(argv)
    try:
        dvc = yaml.safe_load((args.root / "dvc.yaml").read_text())
        params = yaml.safe_load((args.root / "params.yaml").read_text())
        split = [[n for n in v.split(",") if n] for v in (args.only, args.skip)]
        todo = select(ordered(expand(dvc, params)), *split)
    except (OSError, yaml.YAMLError, CommandsError) as err:
        print(f"flows.commands: {err}", file=sys.stderr)
        return 2
    for n, stage in enumerate(todo, 1):
        print(f"# [{n}/{len(todo)}] {stage['name']}\n{stage['cmd']}", flush=True)
        if args.run and subprocess.run(_argv(stage["cmd"]), cwd=args.root).returncode:
            print(f"flows.commands: stage {stage['name']} failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
