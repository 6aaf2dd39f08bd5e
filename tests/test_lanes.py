"""flows.lanes: the stages side by side as cores allow, recorded by DVC as if run one at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from flows import lanes

NAMES = ["prep", "train_ar@a", "train@a-x", "train@a-y", "train@b-x", "evaluate@a-x", "baseline@a"]
EDGES = [
    ("prep", "train_ar@a"),
    ("prep", "train@a-x"),
    ("train_ar@a", "train@a-x"),
    ("train_ar@a", "train@a-y"),
    ("train@a-x", "evaluate@a-x"),
    ("train_ar@a", "baseline@a"),
]


def _plan(seconds: dict[str, float] | None = None, n_cores: int = 2) -> lanes.Plan:
    threads = {n: 1 for n in NAMES} | {"train_ar@a": 2, "baseline@a": None}
    return lanes.plan(NAMES, EDGES, threads, seconds or {}, n_cores)


def test_plan_puts_the_longest_chain_first_and_waits_for_upstream() -> None:
    plan = _plan({"train@a-x": 10, "train@a-y": 30, "train@b-x": 20, "evaluate@a-x": 25})
    # prep -> train_ar@a -> train@a-x -> evaluate@a-x is the longest chain behind prep
    assert plan.order[:2] == ("prep", "train_ar@a")
    assert plan.order.index("train@a-x") < plan.order.index("train@a-y")  # 10 + 25 > 30
    assert plan.ups["train@a-x"] == {"prep", "train_ar@a"} and plan.ups["prep"] == set()
    assert plan.width == {n: 1 for n in NAMES} | {"train_ar@a": 2, "baseline@a": 2}


def test_width_is_threads_capped_at_the_cores_and_unknown_stages_run_alone() -> None:
    assert _plan(n_cores=16).width["train_ar@a"] == 2
    assert _plan(n_cores=16).width["baseline@a"] == 16  # None: alone
    assert _plan(n_cores=1).width["train_ar@a"] == 1
    threads = dict.fromkeys(NAMES, 0)  # 0 = torch's default, all cores
    assert set(lanes.plan(NAMES, EDGES, threads, {}, 4).width.values()) == {4}


def test_bad_core_counts_and_cycles_are_refused() -> None:
    with pytest.raises(lanes.LaneError, match="--cores must be >= 1"):
        _plan(n_cores=0)
    with pytest.raises(lanes.LaneError, match="cycle"):
        lanes.plan(["a", "b"], [("a", "b"), ("b", "a")], {}, {}, 2)


def test_threads_and_seconds_resolve_as_the_stages_do(tmp_path: Path) -> None:
    params = {
        "train": {
            "a": {
                "ar": {"threads": 2},
                "diffusion": {"threads": 1, "steps": 600},
                "paradigms": {"y": {"threads": 3, "steps": 2000}},
            },
            "b": {"diffusion": {}},
        },
        "evaluate": {"threads": 1},
        "bench": {"run": {"threads": 1}},
        "lossless": {"threads": 1, "draft_train": {"threads": 2}},
    }
    assert lanes.stage_threads(params, "train_ar@a") == 2
    assert lanes.stage_threads(params, "train@a-x") == 1
    assert lanes.stage_threads(params, "train@a-y") == 3
    assert lanes.stage_threads(params, "train@b-x") == 0
    # a curve decodes on its training's threads
    assert lanes.stage_threads(params, "curve@a-ar") == 2
    assert lanes.stage_threads(params, "curve@a-x") == 1
    assert lanes.stage_threads(params, "curve@a-y") == 3
    assert lanes.stage_threads(params, "evaluate@a-x") == 1
    assert lanes.stage_threads(params, "bench@a") == 1
    assert lanes.stage_threads(params, "lossless@a") == 2
    assert lanes.stage_threads(params, "textgen@a-x") == 0  # no section: all cores
    assert lanes.stage_threads(params, "report") == 1
    for alone in ("baseline@a", "lmeval@a", "ablate@a", "something_new@a"):
        assert lanes.stage_threads(params, alone) is None
    (tmp_path / "metrics" / "train" / "a").mkdir(parents=True)
    (tmp_path / "metrics" / "train" / "a" / "x.json").write_text(json.dumps({"seconds": 12.5}))
    (tmp_path / "metrics" / "train" / "a" / "ar.json").write_text(json.dumps({"seconds": 99}))
    assert lanes.stage_seconds(tmp_path, "train@a-x") == 12.5
    assert lanes.stage_seconds(tmp_path, "train_ar@a") == 99.0
    assert lanes.stage_seconds(tmp_path, "train@a-y") == lanes.DEFAULT_SECONDS
    assert lanes.stage_seconds(tmp_path, "bench@a") == lanes.DEFAULT_SECONDS


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


def _flat(names: list[str], n_cores: int, edges: list | None = None) -> lanes.Plan:
    return lanes.plan(names, edges or [], dict.fromkeys(names, 1), {}, n_cores)


def test_two_cores_overlap_one_core_does_not_and_upstream_comes_first(tmp_path: Path) -> None:
    stages = ["train@a-x", "train@a-y"]
    assert lanes.run_lanes(_flat(stages, 2), tmp_path, _fake_dvc(tmp_path)) == []
    (x0, x1), (y0, y1) = _ran(tmp_path).values()
    assert max(x0, y0) < min(x1, y1)  # side by side
    record = json.loads((tmp_path / lanes.LOG_DIR / "timeline.json").read_text())
    (a, b) = sorted(record["stages"], key=lambda row: row["stage"])
    assert (a["stage"], b["stage"], a["cores"], a["status"]) == (*stages, 1, "done")
    assert max(a["start_s"], b["start_s"]) < min(a["end_s"], b["end_s"]) <= record["wall_s"]
    (tmp_path / "ran").unlink()
    assert lanes.run_lanes(_flat(stages, 1), tmp_path, _fake_dvc(tmp_path)) == []
    ran = _ran(tmp_path)
    assert ran["train@a-y"][0] >= ran["train@a-x"][1]  # one after the other, in the given order
    assert (tmp_path / lanes.LOG_DIR / "train@a-x.log").exists()
    (tmp_path / "ran").unlink()
    todo = _flat(["up", "down", "other"], 2, [("up", "down")])
    assert lanes.run_lanes(todo, tmp_path, _fake_dvc(tmp_path)) == []
    ran = _ran(tmp_path)
    assert ran["down"][0] >= ran["up"][1]  # waited for its upstream
    assert max(ran["up"][0], ran["other"][0]) < min(ran["up"][1], ran["other"][1])


def test_a_stage_as_wide_as_the_cores_runs_alone(tmp_path: Path) -> None:
    names = ["wide", "narrow1", "narrow2"]
    todo = lanes.plan(names, [], {"wide": None, "narrow1": 1, "narrow2": 1}, {"wide": 100}, 2)
    assert lanes.run_lanes(todo, tmp_path, _fake_dvc(tmp_path)) == []
    ran = _ran(tmp_path)
    for narrow in ("narrow1", "narrow2"):
        assert ran[narrow][0] >= ran["wide"][1]  # first (longest), and alone


def test_a_failed_stage_starts_nothing_new_and_running_ones_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    todo = _flat(["train@a-x", "train@a-y", "train@b-x"], 2)
    failed = lanes.run_lanes(todo, tmp_path, _fake_dvc(tmp_path, fail="train@a-x"))
    assert failed == ["train@a-x"]
    assert set(_ran(tmp_path)) == {"train@a-x", "train@a-y"}  # b-x never started
    out = capsys.readouterr().out
    assert "train@a-x: failed (exit 1): ERROR: failed to reproduce train@a-x" in out
    assert "train@a-y: done in" in out
    assert "lanes: 2 stages in" in out and "core-min idle" in out  # the failed one counts


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
        [sys.executable, "-m", "flows.lanes", "--root", str(repo), "--cores", "2"],
        cwd=Path(lanes.__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 stages on 2 cores" in done.stdout
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"prep", "train@a-x", "train@a-y"}
    assert "up to date" in _sh(sys.executable, "-m", "dvc", "status", cwd=repo)
    (x, x0, x1), (y, y0, y1) = ((repo / f"out-{i}").read_text().split() for i in ("a-x", "a-y"))
    assert x == y == "data"
    assert max(float(x0), float(y0)) < min(float(x1), float(y1))  # they ran side by side
