"""Check (--check) or write (--write) dvc.yaml's code deps: each stage's imports.

``setdiff dvc-deps``: dvc.yaml's code deps, generated from each stage's import closure.

A stage's code deps are exactly the repository files its command imports, directly or not
(`import_closure`: computed statically with `ast`, imports inside functions included, parent
packages included, and the stages a module launches as ``(*SETDIFF, "<name>")`` subprocesses). A
folder stands for its files when every Python file under it is imported. So an edit re-runs
exactly the stages that run the edited file: `setdiff/__init__` loads nothing eagerly (PEP 562),
and a sampler edit (``setdiff/sampling/loop.py``) leaves prepare and tokenize alone.

``setdiff dvc-deps --check`` (CI, through the tests) lists every stage whose code deps differ
from its closure; ``--write`` rewrites those deps in place (other deps, comments and order of
dvc.yaml untouched). Deps that are not code (data, models, metrics, and non-Python files inside a
package such as ``setdiff/lmeval/tasks``) are the author's and are kept as written.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import sys
from pathlib import Path

import yaml

PACKAGES = ("setdiff", "flows", "reports", "metrics_schema")
"""The repository's own top-level packages: their files are code deps."""

DVC_YAML = "dvc.yaml"


def module_path(module: str, root: Path) -> Path | None:
    """The file of `module` inside the repository, or None (third-party or missing)."""
    base = root.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def imported_modules(module: str, path: Path) -> set[str]:
    """Every module an import statement of `path` may name (functions included); for
    ``from a import b`` both ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def launched_stages(path: Path) -> set[str]:
    """Stage names of ``(*SETDIFF, "<name>")`` commands built in `path` (run as subprocesses)."""
    stages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Tuple | ast.List):
            continue
        elts = node.elts
        for first, second in zip(elts, elts[1:], strict=False):
            is_setdiff = isinstance(first, ast.Starred) and ast.unparse(first.value) == "SETDIFF"
            if is_setdiff and isinstance(second, ast.Constant) and isinstance(second.value, str):
                stages.add(second.value)
    return stages


def stage_modules(name: str) -> list[str]:
    """What ``setdiff <name>`` runs: the dispatcher and the stage's module."""
    return ["setdiff.cli", f"setdiff.stages.{name}"]


def import_closure(entry: list[str], root: Path) -> set[str]:
    """Repository files (relative paths) imported, directly or not, by the `entry` modules."""
    seen: dict[str, Path] = {}
    todo = list(entry)
    while todo:
        module = todo.pop()
        if module.split(".")[0] not in PACKAGES or module in seen:
            continue
        path = module_path(module, root)
        if path is None:
            continue
        seen[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        todo += imported_modules(module, path)
        todo += [m for name in launched_stages(path) for m in stage_modules(name)]
    return {p.relative_to(root).as_posix() for p in seen.values()}


def entry_modules(cmd: str) -> list[str]:
    """The modules a stage command runs first (``setdiff <stage>`` or ``python -m <module>``)."""
    words = shlex.split(cmd)
    if words[0] == "setdiff":
        return stage_modules(words[1])
    if words[:2] == ["python", "-m"]:
        return [words[2]]
    raise ValueError(f"{DVC_YAML}: cannot tell which module runs {cmd!r}")


def python_files(folder: Path, root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix() for p in folder.rglob("*.py") if "__pycache__" not in p.parts
    }


def folded(files: set[str], root: Path) -> list[str]:
    """`files` with every folder whose Python files are all among them written as the folder
    (the highest such folder below a top-level package), sorted."""
    out: set[str] = set()
    for file in files:
        parts = file.split("/")
        dep = file
        for depth in range(2, len(parts)):  # setdiff/x, setdiff/x/y, ... never a whole package
            folder = "/".join(parts[:depth])
            if python_files(root / folder, root) <= files:
                dep = folder
                break
        out.add(dep)
    return sorted(out)


def is_code(dep: str, root: Path) -> bool:
    """A dep the generator owns: a Python file of a package, or a folder holding some."""
    if "${" in dep or dep.split("/")[0] not in PACKAGES:
        return False
    path = root / dep
    return dep.endswith(".py") or (path.is_dir() and bool(python_files(path, root)))


def stages(root: Path) -> dict[str, dict]:
    """dvc.yaml's stages by name (a ``foreach`` stage's ``do`` body)."""
    dvc = yaml.safe_load((root / DVC_YAML).read_text())
    return {name: stage.get("do", stage) for name, stage in dvc["stages"].items()}


def expected_code_deps(stage: dict, root: Path) -> list[str]:
    """The code deps a stage should list: its import closure, folded."""
    return folded(import_closure(entry_modules(stage["cmd"]), root), root)


def problems(root: Path) -> list[str]:
    """One line per stage whose code deps differ from its import closure (none: up to date)."""
    lines = []
    for name, stage in stages(root).items():
        listed = [d for d in stage.get("deps", []) if is_code(d, root)]
        want = expected_code_deps(stage, root)
        missing, extra = sorted(set(want) - set(listed)), sorted(set(listed) - set(want))
        if missing or extra:
            lines.append(
                f"{DVC_YAML}: stage {name}: code deps differ from its import closure"
                f" (missing {missing}, not imported {extra}); run `setdiff dvc-deps --write`"
            )
    return lines


_HEADER = re.compile(r"^  ([A-Za-z0-9_]+):\s*$")
_DEPS = re.compile(r"^(\s+)deps:\s*$")


def rewrite(text: str, root: Path) -> str:
    """`text` (dvc.yaml) with each stage's code deps replaced by its import closure; every other
    line (other deps, params, outs, comments) as it was. The code deps take the place of the
    first code dep listed (or go last in the list)."""
    all_stages = stages(root)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stage: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _HEADER.match(line)
        if header:
            stage = header.group(1)
        deps = _DEPS.match(line)
        out.append(line)
        i += 1
        if not deps or stage not in all_stages:
            continue
        items: list[str] = []
        while (
            i < len(lines)
            and lines[i].strip().startswith("- ")
            and (len(lines[i]) - len(lines[i].lstrip()) > len(deps.group(1)))
        ):
            items.append(lines[i])
            i += 1
        indent = items[0][: len(items[0]) - len(items[0].lstrip())] if items else ""
        indent = indent or deps.group(1) + "  "
        code = [f"{indent}- {dep}\n" for dep in expected_code_deps(all_stages[stage], root)]
        kept: list[str] = []
        placed = False
        for item in items:
            if is_code(item.strip()[2:].split(" #")[0].strip(), root):
                if not placed:
                    kept += code
                    placed = True
            else:
                kept.append(item)
        out += kept if placed else kept + code
    return "".join(out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="setdiff dvc-deps",
        description="Check or write dvc.yaml's code deps: each stage's import closure.",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list stages whose deps are stale")
    mode.add_argument("--write", action="store_true", help="rewrite the code deps in place")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not (root / DVC_YAML).is_file():
        raise FileNotFoundError(f"{root / DVC_YAML}: no such file (--root names the repository)")
    if args.write:
        path = root / DVC_YAML
        path.write_text(rewrite(path.read_text(), root))
    stale = problems(root)
    for line in stale:
        print(line, file=sys.stderr)
    if stale:
        sys.exit(1)
    print(f"{DVC_YAML}: every stage's code deps are its import closure")
