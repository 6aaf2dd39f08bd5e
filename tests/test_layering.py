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


REPORT_LAYERS = ("inputs", "analysis", "render")
"""reports/ by role, top to bottom: a layer imports only the layers above it; `items`, `build`
and `diff` (the registry and the two command lines) sit below them all."""


def report_modules(path: Path) -> set[str]:
    """The second component of every ``reports.X`` import in a file (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        names |= {m.split(".")[1] for m in modules if m.startswith("reports.")}
    return names


@pytest.mark.parametrize("layer", REPORT_LAYERS)
def test_report_layers_import_only_the_layers_above(layer: str) -> None:
    above = set(REPORT_LAYERS[: REPORT_LAYERS.index(layer) + 1])
    files = sorted((ROOT / "reports" / layer).rglob("*.py"))
    assert files, f"reports/{layer}/ has no modules?"
    bad = {str(f.relative_to(ROOT)): sorted(report_modules(f) - above) for f in files}
    assert {f: names for f, names in bad.items() if names} == {}


def test_the_report_layer_scanner(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from reports import items\nimport reports.render.style\n")
    assert report_modules(source) == {"items", "render"}


def test_the_metrics_schema_imports_only_the_standard_library() -> None:
    """`metrics_schema` sits below both of its readers (`reports` and ``setdiff summary``), so it
    may import nothing from the project and nothing that is not in the standard library."""
    import sys

    files = sorted((ROOT / "metrics_schema").rglob("*.py"))
    assert files
    found = set().union(*(imported_packages(f) for f in files))
    assert sorted(found - set(sys.stdlib_module_names) - {"__future__"}) == []


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


STAGES = ROOT / "setdiff" / "stages"


def test_no_stage_module_imports_another_stage_module() -> None:
    """A stage keeps its CLI and orchestration; what stages share lives below them (the shared
    CLI/layout helper `setdiff.stages.common` excepted)."""
    allowed = {"setdiff.stages", "setdiff.stages.common"}
    bad = {}
    for path in sorted(STAGES.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                if node.module == "setdiff.stages":
                    names |= {f"setdiff.stages.{alias.name}" for alias in node.names}
        stages = sorted(n for n in names if n.startswith("setdiff.stages") and n not in allowed)
        if stages:
            bad[path.name] = stages
    assert bad == {}


def test_stages_read_params_only_through_the_preset() -> None:
    """Stages call `setdiff.preset.load_preset` and read typed sections; no stage reads the raw
    mapping (`setdiff.params`, ``get_path``, or ``section`` on anything but the preset)."""
    bad = {}
    for path in sorted(STAGES.glob("*.py")):
        found = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "setdiff.params":
                found += [a.name for a in node.names if a.name != "Params"]
            elif isinstance(node, ast.Attribute) and node.attr == "get_path":
                found.append("get_path")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = node.func.value
                if node.func.attr == "section" and getattr(receiver, "id", None) != "preset":
                    found.append("section")
        if found:
            bad[path.name] = found
    assert bad == {}
