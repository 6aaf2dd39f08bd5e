"""flows.lanes: the train stages side by side, recorded by DVC as if run one at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from flows import lanes

NAMES = ["prep", "train_ar@a", "train@a-x", "train@a-y", "train@b-x", "evaluate@a-x"]
EDGES = [
    ("prep", "train_ar@a"),
    ("prep", "train@a-x"),
    ("train_ar@a", "train@a-x"),
    ("train_ar@a", "train@a-y"),
    ("train@a-x", "evaluate@a-x"),
]
TRAIN = ["train@a-x", "train@a-y", "train@b-x"]


def _plan(
    threads: int = 1, n_cores: int = 2, n_lanes: int | None = None, seconds: tuple = (0, 0, 0)
) -> lanes.Plan:
    costs = {s: (float(t), 0.0) for s, t in zip(TRAIN, seconds, strict=True)}
    return lanes.plan(NAMES, EDGES, dict.fromkeys(TRAIN, threads), costs, n_cores, n_lanes)


def test_plan_runs_the_upstream_first_and_the_longest_stage_first() -> None:
    plan = _plan(seconds=(10, 30, 20))
    assert plan.upstream == ("prep", "train_ar@a")  # file order; evaluate is downstream
    assert plan.stages == ("train@a-y", "train@b-x", "train@a-x")
    assert plan.lanes == 2


def test_lanes_follow_cores_and_threads() -> None:
    assert _plan(threads=1, n_cores=2).lanes == 2
    assert _plan(threads=2, n_cores=2).lanes == 1
    assert _plan(threads=0, n_cores=16).lanes == 1  # 0 = torch's default, all cores
    assert _plan(threads=4, n_cores=16).lanes == 4
    assert _plan(threads=1, n_cores=2, n_lanes=1).lanes == 1


def test_oversubscribed_or_dependent_lanes_are_refused() -> None:
    with pytest.raises(lanes.LaneError, match=r"--lanes 2 x 2 threads .* > 2 cores"):
        _plan(threads=2, n_cores=2, n_lanes=2)
    with pytest.raises(lanes.LaneError, match="--lanes must be >= 1"):
        _plan(n_lanes=0)
    edges = [*EDGES, ("train@a-x", "train@b-x")]
    with pytest.raises(lanes.LaneError, match="train@b-x depends on train@a-x"):
        lanes.plan(NAMES, edges, dict.fromkeys(TRAIN, 1), dict.fromkeys(TRAIN, (0, 0)), 2)


def test_threads_and_costs_resolve_as_the_train_stage_does(tmp_path: Path) -> None:
    params = {
        "train": {
            "a": {
                "diffusion": {"threads": 1, "steps": 600},
                "paradigms": {"y": {"threads": 3, "steps": 2000}},
            },
            "b": {"diffusion": {}},
        }
    }
    assert lanes.stage_threads(params, "train@a-x") == 1
    assert lanes.stage_threads(params, "train@a-y") == 3
    assert lanes.stage_threads(params, "train@b-x") == 0
    (tmp_path / "metrics" / "train" / "a").mkdir(parents=True)
    (tmp_path / "metrics" / "train" / "a" / "x.json").write_text(json.dumps({"seconds": 12.5}))
    assert lanes.stage_cost(tmp_path, params, "train@a-x") == (12.5, 600.0)
    assert lanes.stage_cost(tmp_path, params, "train@a-y") == (0.0, 2000.0)


def test_edges_from_dvc_dag_dot() -> None:
    dot = 'strict digraph {\n"prep";\n"train@a-x";\n"prep" -> "train@a-x";\n}\n'
    assert lanes.edges_from_dot(dot) == [("prep", "train@a-x")]


def _fake_dvc(tmp_path: Path, fail: str = "") -> tuple[str, ...]:
    """A `dvc` that records when each stage ran, sleeping 1 s; `fail` exits 1 after 0.2 s."""
    script = tmp_path / "fake_dvc.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            stage = sys.argv[-1]
            start = time.time()
            time.sleep(0.2 if stage == {fail!r} else 1.0)
            with open({str(tmp_path / "ran")!r}, "a") as f:
                f.write(f"{{stage}} {{start}} {{time.time()}}\\n")
            if stage == {fail!r}:
                print("ERROR: failed to reproduce " + stage)
                sys.exit(1)
            """
        )
    )
    return (sys.executable, str(script))


def _ran(tmp_path: Path) -> dict[str, tuple[float, float]]:
    rows = (line.split() for line in (tmp_path / "ran").read_text().splitlines())
    return {name: (float(a), float(b)) for name, a, b in rows}


def test_two_lanes_overlap_and_one_lane_does_not(tmp_path: Path) -> None:
    stages = ["train@a-x", "train@a-y"]
    assert lanes.run_lanes(stages, 2, tmp_path, _fake_dvc(tmp_path)) == []
    (x0, x1), (y0, y1) = _ran(tmp_path).values()
    assert max(x0, y0) < min(x1, y1)  # side by side
    (tmp_path / "ran").unlink()
    assert lanes.run_lanes(stages, 1, tmp_path, _fake_dvc(tmp_path)) == []
    ran = _ran(tmp_path)
    assert ran["train@a-y"][0] >= ran["train@a-x"][1]  # one after the other, in the given order
    assert (tmp_path / lanes.LOG_DIR / "train@a-x.log").exists()


def test_a_failed_stage_starts_nothing_new_and_running_ones_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = ["train@a-x", "train@a-y", "train@b-x"]
    failed = lanes.run_lanes(stages, 2, tmp_path, _fake_dvc(tmp_path, fail="train@a-x"))
    assert failed == ["train@a-x"]
    assert set(_ran(tmp_path)) == {"train@a-x", "train@a-y"}  # b-x never started
    out = capsys.readouterr().out
    assert "train@a-x: failed (exit 1): ERROR: failed to reproduce train@a-x" in out
    assert "train@a-y: done in" in out


def _sh(*argv: str, cwd: Path) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_real_dvc_records_stages_run_side_by_side(tmp_path: Path) -> None:
    """Two train stages through DVC at once: both end up in dvc.lock, `dvc status` is clean."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _sh("git", "init", "-q", cwd=repo)
    _sh(sys.executable, "-m", "dvc", "init", "-q", cwd=repo)
    train = (
        "import sys, time; t = time.time(); time.sleep(1.5); "
        "open(sys.argv[1], 'w').write(open('up').read() + f'{t} {time.time()}')"
    )
    stages = {
        "prep": {"cmd": "echo data > up", "outs": ["up"]},
        "train": {
            "foreach": ["a-x", "a-y"],
            "do": {
                "cmd": f'{sys.executable} -c "{train}" out-${{item}}',
                "deps": ["up"],
                "outs": ["out-${item}"],
            },
        },
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    params = {"train": {"a": {"diffusion": {"threads": 1}}}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run(
        [sys.executable, "-m", "flows.lanes", "--root", str(repo), "--lanes", "2"],
        cwd=Path(lanes.__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 train stages, 2 at a time" in done.stdout
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"prep", "train@a-x", "train@a-y"}
    assert "up to date" in _sh(sys.executable, "-m", "dvc", "status", cwd=repo)
    (x, x0, x1), (y, y0, y1) = ((repo / f"out-{i}").read_text().split() for i in ("a-x", "a-y"))
    assert x == y == "data"
    assert max(float(x0), float(y0)) < min(float(x1), float(y1))  # they ran side by side
