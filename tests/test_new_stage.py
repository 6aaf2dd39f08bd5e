"""Adding a stage touches its own files only (issue 36): its module (``setdiff/stages/<stage>.py``,
with its computation beside it in the library), its DVC stage and its preset section. No central
list names it: the ``setdiff`` command, preset validation (the section, ``study.<stage>``) and
the lanes of ``make run`` find what the module declares.

The test drops a stage module into a scratch copy of the code, edits nothing else, and runs it
there; a hand-written list of stages, sections or study lists anywhere would refuse it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

FRESH = '''\
"""Count the fresh things of one task; metrics/fresh/.

A stage this test adds to a copy of the code: its module is all it brings.
"""

from __future__ import annotations

from setdiff.config import Count, Threads, frozen
from setdiff.preset import Preset
from setdiff.study import StudyConfig

PARAMS: tuple[str, ...] = ("fresh",)
SECTION = "fresh"
STUDY = "fresh"
STUDY_TASKS = "answers"
STUDY_PARADIGMS = ("setdlm",)
THREADS = ("fresh.threads",)


@frozen
class FreshConfig:
    n: Count = 1
    threads: Threads = 0


def check_preset(preset: Preset, study: StudyConfig) -> None:
    if "fresh" in preset or study.tasks_for("fresh"):
        preset.section("fresh", FreshConfig)


def main(argv: list[str]) -> None:
    print("fresh ran with", argv)
'''

CHECK = """\
import sys
from pathlib import Path

import yaml

from flows.lanes import declared_threads, stage_threads
from setdiff.config import ConfigError
from setdiff.params import load_params
from setdiff.validate import validate

base = yaml.safe_load(Path("smoke.yaml").read_text())
cases = {
    "on": ({"fresh": {"n": 2, "threads": 1}}, {"fresh": ["arith"]}),
    "bad": ({"fresh": {"n": 0}}, {}),
    "text": ({"fresh": {}}, {"fresh": ["text"]}),
    "missing": ({}, {"fresh": ["arith"]}),
    "no setdlm": (
        {"fresh": {}},
        {"fresh": ["arith"], "floor": [], "lossless": [], "paradigms": ["ar"], "diffusion": []},
    ),
}
for name, (sections, lists) in cases.items():
    preset = {**base, **sections, "study": {**base["study"], **lists}}
    Path(f"{name}.yaml").write_text(yaml.safe_dump(preset))
    try:
        study = validate(load_params(f"{name}.yaml"))
        print(name, "accepted", study.tasks_for("fresh"))
    except ConfigError as err:
        print(name, "refused:", err)
declared = declared_threads(Path("setdiff/stages"))
params = {"fresh": {"threads": 1}}
print("threads", declared["fresh"], stage_threads(params, "fresh@arith", declared))
"""


def test_a_stage_is_its_module(tmp_path: Path) -> None:
    for package in ("setdiff", "flows"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "setdiff" / "stages" / "fresh.py").write_text(FRESH)
    shutil.copy(ROOT / "params" / "smoke.yaml", tmp_path / "smoke.yaml")

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, check=True
        )
        return done.stdout

    assert "  fresh     Count the fresh things of one task; metrics/fresh/.\n" in run(
        "-m", "setdiff.cli", "--help"
    )
    assert run("-m", "setdiff.cli", "fresh", "--task", "arith") == (
        "fresh ran with ['--task', 'arith']\n"
    )
    (tmp_path / "check.py").write_text(textwrap.dedent(CHECK))
    lines = run("check.py").splitlines()
    assert lines[0] == "on accepted ('arith',)"
    assert lines[1].endswith("bad.yaml: fresh.n: must be >= 1, got 0")
    assert lines[2].endswith(
        "text.yaml: study.fresh: ['text'] have no checkable answers (['arith', 'gsm', 'gsm8k'])"
    )
    assert lines[3].endswith("missing.yaml: missing key 'fresh' under <top>")
    assert lines[4].endswith(
        "no setdlm.yaml: study.fresh lists ['arith']: fresh needs ['setdlm'] in study.paradigms"
    )
    assert lines[5] == "threads ('fresh.threads',) 1"


def test_the_rule_holds_for_the_stages_there_are() -> None:
    """Every stage's declarations are what validation reads: each section a top-level key of the
    default preset or absent from it, each study list a key of its ``study``."""
    from setdiff.validate import CORE, stages

    declared = stages()
    sections = [s.section for s in declared if s.section]
    lists = [s.study for s in declared if s.study]
    assert len(set(sections)) == len(sections) and not set(sections) & set(CORE)
    assert len(set(lists)) == len(lists)
    assert {s.study_tasks for s in declared} <= {None, "answers", "stream"}
    assert all(s.study for s in declared if s.study_tasks or s.study_paradigms)
    default = yaml.safe_load((ROOT / "params" / "default.yaml").read_text())
    assert set(default) <= {*CORE, *sections}
    assert set(default["study"]) == {"tasks", "paradigms", "diffusion", *lists}
