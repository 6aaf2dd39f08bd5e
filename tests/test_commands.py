"""`flows.commands`: the study's stage commands without DVC, expanded and ordered as DVC does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows import commands

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stages() -> list[dict]:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    return commands.ordered(commands.expand(dvc, params))


@pytest.mark.skipif(
    shutil.which("dvc") is None and not (ROOT / ".venv/bin/dvc").exists(), reason="no dvc"
)
def test_the_stages_are_dvcs(stages: list[dict]) -> None:
    dvc = shutil.which("dvc") or str(ROOT / ".venv/bin/dvc")
    listed = subprocess.run(
        [dvc, "stage", "list", "--name-only"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(s["name"] for s in stages) == sorted(listed)


def test_every_stage_follows_the_stages_it_reads(stages: list[dict]) -> None:
    seen: set[str] = set()
    for stage in stages:
        for other in stages:
            if any(commands._reads(d, o) for d in stage["deps"] for o in other["outs"]):
                assert other is stage or other["name"] in seen, (stage["name"], other["name"])
        seen.add(stage["name"])
    names = [s["name"] for s in stages]
    assert names.index("train_ar@arith") < names.index("train@arith-setdlm")
    assert names.index("evaluate@arith-ar") < names.index("tradeoff@arith") < names.index("report")


def test_references_are_filled(stages: list[dict]) -> None:
    by_name = {s["name"]: s["cmd"] for s in stages}
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert by_name["train@arith-setdlm"] == "setdiff train --task arith --paradigm setdlm"
    workers = params["ablation"]["budget"]["workers"]
    assert f"--dask-workers {workers} " in by_name["ablate@arith"]
    assert not any("${" in s["cmd"] for s in stages)


def _tiny(tmp_path: Path, fail: str = "") -> Path:
    log = tmp_path / "log.txt"
    say = f"{sys.executable} -c \"import sys; open('{log}', 'a').write(sys.argv[1] + chr(10))"
    dvc = {
        "stages": {
            "second": {"cmd": f'{say}" second', "deps": ["a.txt"], "outs": ["b.txt"]},
            "first": {
                "foreach": "${tasks}",
                "do": {"cmd": f'{say}" first-${{item}}', "outs": [{"a.txt": {"cache": False}}]},
            },
            "broken": {"cmd": f'{sys.executable} -c "raise SystemExit({int(bool(fail))})"'},
            "last": {"cmd": f'{say}" last', "deps": ["b.txt"]},
        }
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"tasks": ["x", "y"]}))
    return log


def test_run_in_order_and_stop_at_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _tiny(tmp_path)
    assert commands.main(["--root", str(tmp_path), "--run", "--skip", "first@y"]) == 0
    assert log.read_text().split() == ["first-x", "second", "last"]
    log.unlink()
    _tiny(tmp_path, fail="broken")
    assert commands.main(["--root", str(tmp_path), "--run"]) == 1
    assert log.read_text().split() == ["first-x", "first-y", "second"]  # nothing after it
    assert "stage broken failed" in capsys.readouterr().err


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tiny(tmp_path)
    assert commands.main(["--root", str(tmp_path), "--only", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown stage 'nosuch'" in err and "first" in err
    (tmp_path / "dvc.yaml").write_text("stages: {s: {cmd: 'echo ${missing.key}'}}")
    assert commands.main(["--root", str(tmp_path)]) == 2
    assert "dvc.yaml stages.s: ${missing.key} names no value" in capsys.readouterr().err
