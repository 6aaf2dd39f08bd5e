"""dvc.yaml's record of code: every stage's `deps` cover the stage's whole import closure inside
the repository, so a change to any module a stage runs re-runs that stage.

The closure is computed statically (`ast`, imports inside functions included) over the
repository's own packages. A stage command is ``setdiff <name>`` (``setdiff/cli.py``, which
imports ``setdiff.stages.<name>``) or ``python -m <module>``; a module that launches
``(*SETDIFF, "<name>")`` subprocesses (the ablation flow's trials) runs those stages too."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("setdiff", "flows", "reports", "metrics_schema")


def module_path(module: str, root: Path = ROOT) -> Path | None:
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


def import_closure(entry: list[str], root: Path = ROOT) -> set[str]:
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
    return {str(p.relative_to(root)) for p in seen.values()}


def stage_modules(name: str) -> list[str]:
    return ["setdiff.cli", f"setdiff.stages.{name}"]


def entry_modules(cmd: str) -> list[str]:
    """The modules a stage command runs first."""
    words = shlex.split(cmd)
    if words[0] == "setdiff":
        return stage_modules(words[1])
    if words[:2] == ["python", "-m"]:
        return [words[2]]
    raise AssertionError(f"dvc.yaml: cannot tell which module runs {cmd!r}")


def stages() -> dict[str, dict]:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    return {name: stage.get("do", stage) for name, stage in dvc["stages"].items()}


def uncovered(files: set[str], deps: list[str]) -> list[str]:
    """Files that no dep (a file, or a folder above it) covers."""
    prefixes = [d.rstrip("/") for d in deps if "${" not in d]
    return sorted(f for f in files if not any(f == p or f.startswith(p + "/") for p in prefixes))


@pytest.mark.parametrize("name", sorted(stages()))
def test_stage_deps_cover_its_import_closure(name: str) -> None:
    stage = stages()[name]
    entry = entry_modules(stage["cmd"])
    for module in entry:
        assert module_path(module), f"dvc.yaml: stage {name}: no module {module} in the repository"
    missing = uncovered(import_closure(entry), stage.get("deps", []))
    assert missing == [], f"dvc.yaml: stage {name}: deps miss {missing}"


def test_closure_follows_lazy_relative_and_subprocess_imports(tmp_path: Path) -> None:
    (tmp_path / "setdiff" / "stages").mkdir(parents=True)
    (tmp_path / "flows").mkdir()
    files = {
        "setdiff/__init__.py": "",
        "setdiff/cli.py": "import importlib\n",
        "setdiff/stages/__init__.py": "",
        "setdiff/stages/go.py": "def main():\n    from .. import lazy\n",
        "setdiff/lazy.py": "from setdiff import leaf\nimport torch\n",
        "setdiff/leaf.py": "",
        "setdiff/unused.py": "",
        "flows/__init__.py": "",
        "flows/run.py": 'from flows.tasks import SETDIFF\nCOMMAND = (*SETDIFF, "go")\n',
        "flows/tasks.py": "SETDIFF = ()\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    closure = import_closure(["flows.run"], tmp_path)
    assert closure == set(files) - {"setdiff/unused.py"}
    missing = uncovered(closure, ["setdiff", "flows/run.py"])
    assert missing == ["flows/__init__.py", "flows/tasks.py"]
