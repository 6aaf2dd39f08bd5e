"""Import direction (style 3.1): flows/ and reports/ never import torch or setdiff (they call
the CLI and read artifacts); setdiff/ never imports the orchestration and analysis stack."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "flows": {"torch", "setdiff"},
    "reports": {"torch", "setdiff"},
    "setdiff": {"prefect", "prefect_dask", "dask", "distributed", "dvc", "optuna", "pandas"}
    | {"seaborn"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level packages of every import in a file (functions included), relative excluded."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    if package == "setdiff":
        assert files, "setdiff/ has no modules?"
    bad = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) & FORBIDDEN[package]) for f in files
    }
    assert {f: names for f, names in bad.items() if names} == {}


def test_the_scanner_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import torch.nn\n    from optuna import trial\n")
    assert imported_packages(source) == {"torch", "optuna"}


def calls_set_num_threads(path: Path) -> bool:
    """Whether a file calls `set_num_threads` (as ``torch.set_num_threads`` or imported bare)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "set_num_threads":
                return True
    return False


def test_only_runtime_sets_torch_threads() -> None:
    """Thread set-up has one home, `setdiff.runtime.setup_torch` (issue 13)."""
    files = sorted((ROOT / "setdiff").rglob("*.py"))
    callers = [str(f.relative_to(ROOT)) for f in files if calls_set_num_threads(f)]
    assert callers == ["setdiff/runtime.py"]


def test_the_thread_scanner_sees_both_spellings(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import torch\ntorch.set_num_threads(2)\n")
    assert calls_set_num_threads(source)
    source.write_text("from torch import set_num_threads\nset_num_threads(2)\n")
    assert calls_set_num_threads(source)
    source.write_text("import torch\ntorch.get_num_threads()\n")
    assert not calls_set_num_threads(source)


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of every absolute import in a file (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_sampling_sits_below_artifacts_and_stages() -> None:
    """The decode loop takes a model and its paradigm; it never reaches up to the loaders
    (`setdiff.artifacts`) or the stages."""
    above = ("setdiff.artifacts", "setdiff.stages")
    files = sorted((ROOT / "setdiff" / "sampling").rglob("*.py"))
    assert files, "setdiff/sampling/ has no modules?"
    bad = {
        str(f.relative_to(ROOT)): sorted(
            m for m in imported_modules(f) if any(m == a or m.startswith(a + ".") for a in above)
        )
        for f in files
    }
    assert {f: names for f, names in bad.items() if names} == {}
