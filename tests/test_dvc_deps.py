"""dvc.yaml's record of code: every stage's code deps are exactly the stage's import closure in
the repository (`setdiff.dvcdeps`), so a change to any module a stage runs re-runs that stage and
a change to any other module does not.

The closure is computed statically (`ast`, imports inside functions included) over the
repository's own packages. A stage command is ``setdiff <name>`` (``setdiff/cli.py``, which
imports ``setdiff.stages.<name>``) or ``python -m <module>``; a module that launches
``(*SETDIFF, "<name>")`` subprocesses (the ablation flow's trials) runs those stages too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from setdiff.cli import main as cli
from setdiff.dvcdeps import entry_modules, import_closure, module_path, problems, rewrite, stages

ROOT = Path(__file__).resolve().parents[1]


def uncovered(files: set[str], deps: list[str]) -> list[str]:
    """Files that no dep (a file, or a folder above it) covers."""
    prefixes = [d.rstrip("/") for d in deps if "${" not in d]
    return sorted(f for f in files if not any(f == p or f.startswith(p + "/") for p in prefixes))


def test_every_stage_lists_exactly_its_import_closure() -> None:
    """`setdiff dvc-deps --check`: the committed dvc.yaml is what `--write` would make it."""
    assert problems(ROOT) == []


@pytest.mark.parametrize("name", sorted(stages(ROOT)))
def test_stage_deps_cover_its_import_closure(name: str) -> None:
    stage = stages(ROOT)[name]
    entry = entry_modules(stage["cmd"])
    for module in entry:
        assert module_path(module, ROOT), f"dvc.yaml: stage {name}: no module {module}"
    missing = uncovered(import_closure(entry, ROOT), stage.get("deps", []))
    assert missing == [], f"dvc.yaml: stage {name}: deps miss {missing}"


SAMPLER = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "setdiff/sampling").glob("*.py"))


@pytest.mark.parametrize("name", ["prepare", "tokenize", "train_ar", "train"])
def test_a_sampler_edit_leaves_the_data_and_train_stages_alone(name: str) -> None:
    """DVC re-runs a stage when a dep changes; a sampler file (any of `setdiff/sampling/`) no
    dep of prepare, tokenize or train covers leaves them clean (`dvc status`), and those deps
    are true (the check above): the paradigms sit below the sampler and never import it, and
    training keeps its evaluations' weights for the curve stage to decode."""
    assert len(SAMPLER) > 5
    assert uncovered(set(SAMPLER), stages(ROOT)[name]["deps"]) == SAMPLER


def test_importing_setdiff_loads_nothing() -> None:
    """PEP 562: `import setdiff` runs no submodule and no torch; a public name loads its own."""
    code = (
        "import sys, setdiff; loaded = sorted(m for m in sys.modules if m.startswith('setdiff'));"
        "print(loaded, 'torch' in sys.modules); setdiff.generate; setdiff.masks.set_causal_mask"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "['setdiff'] False"


def test_write_replaces_only_the_code_deps(tmp_path: Path) -> None:
    """`--write` fixes a stale list in place: the closure replaces the code deps where they
    were; data deps, params, comments and other stages stay as written; `--check` then passes
    (and fails, naming the stage and the fix, before)."""
    (tmp_path / "setdiff" / "stages").mkdir(parents=True)
    (tmp_path / "setdiff" / "sub").mkdir()
    files = {
        "setdiff/__init__.py": "",
        "setdiff/cli.py": "",
        "setdiff/stages/__init__.py": "",
        "setdiff/stages/go.py": "from setdiff.sub import a\n",
        "setdiff/sub/__init__.py": "",
        "setdiff/sub/a.py": "",
        "setdiff/unused.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    stale = (
        "stages:\n"
        "  # a comment\n"
        "  go:\n"
        "    cmd: setdiff go --task t\n"
        "    deps:\n"
        "      - data/raw  # kept\n"
        "      - setdiff/unused.py\n"
        "    params:\n"
        "      - go.seed\n"
    )
    (tmp_path / "dvc.yaml").write_text(stale)
    assert [line.split(" (")[0] for line in problems(tmp_path)] == [
        "dvc.yaml: stage go: code deps differ from its import closure"
    ]
    with pytest.raises(SystemExit) as stopped:
        cli(["dvc-deps", "--check", "--root", str(tmp_path)])
    assert stopped.value.code == 1
    cli(["dvc-deps", "--write", "--root", str(tmp_path)])
    assert (tmp_path / "dvc.yaml").read_text() == stale.replace(
        "      - setdiff/unused.py\n",
        "      - setdiff/__init__.py\n"
        "      - setdiff/cli.py\n"
        "      - setdiff/stages\n"
        "      - setdiff/sub\n",  # every file of a folder imported: the folder
    )
    assert problems(tmp_path) == []
    assert (
        rewrite((tmp_path / "dvc.yaml").read_text(), tmp_path)
        == (tmp_path / "dvc.yaml").read_text()
    )


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
