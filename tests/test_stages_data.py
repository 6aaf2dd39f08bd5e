"""End-to-end tests of the `prepare` and `tokenize` stages on tiny sizes in a temp dir."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from setdiff import cli
from setdiff.config import ConfigError
from setdiff.files import write_bytes
from setdiff.stages import prepare, tokenize
from setdiff.tokenizer import load_tokenizer

PARAMS: dict[str, Any] = {
    "data": {
        "seed": 0,
        "arith": {"n_train": 50, "n_valid": 20, "n_test": 20},
        "text": {"valid_books": ["Ruth"], "test_books": ["Jonah"], "max_train_verses": 2000},
    },
    "tokenizer": {
        "arith": {"kind": "char", "seq_len": 24},
        "text": {"kind": "bpe", "vocab_size": 300, "seq_len": 64},
    },
}


def write_params(path: Path, **data_overrides: Any) -> Path:
    params = json.loads(json.dumps(PARAMS))
    params["data"].update(data_overrides)
    path.write_text(yaml.safe_dump(params))
    return path


def run(stage: Any, params: Path, out: Path, task: str) -> None:
    """Run a stage with its data root at `out` (i.e. ``--root`` = a folder whose data/ is out)."""
    root = out.parent / f"{out.name}-root"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "data").exists():
        (root / "data").symlink_to(out.resolve(), target_is_directory=True)
        out.mkdir(parents=True, exist_ok=True)
    stage.main(["--params", str(params), "--task", task, "--root", str(root)])


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def arith_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("arith")
    params = write_params(root / "params.yaml")
    run(prepare, params, root / "data", "arith")
    run(tokenize, params, root / "data", "arith")
    return root / "data"


def test_prepare_writes_splits_and_manifest(arith_out: Path) -> None:
    raw = arith_out / "arith" / "raw"
    manifest = json.loads((raw / "manifest.json").read_text())
    assert manifest["seed"] == 0 and manifest["task"] == "arith"
    assert manifest["config"]["n_train"] == 50 and manifest["config"]["max_terms"] == 3
    assert "reasoning-gym" in manifest["versions"]
    for name, count in {"train": 50, "valid": 20, "test": 20}.items():
        payload = (raw / f"{name}.jsonl").read_bytes()
        assert manifest["splits"][name]["count"] == count == payload.count(b"\n")
        assert manifest["splits"][name]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert not [p for p in raw.iterdir() if p.name.endswith(".tmp")]


def test_prepare_is_byte_deterministic_and_seeded(arith_out: Path, tmp_path: Path) -> None:
    run(prepare, write_params(tmp_path / "same.yaml"), tmp_path / "same", "arith")
    assert files(tmp_path / "same" / "arith" / "raw") == files(arith_out / "arith" / "raw")
    run(prepare, write_params(tmp_path / "other.yaml", seed=1), tmp_path / "other", "arith")
    for name in ("train.jsonl", "valid.jsonl", "test.jsonl"):
        other = (tmp_path / "other" / "arith" / "raw" / name).read_bytes()
        assert other != (arith_out / "arith" / "raw" / name).read_bytes()


def test_prepare_splits_are_disjoint(arith_out: Path) -> None:
    raw = arith_out / "arith" / "raw"
    prompts = [
        json.loads(line)["prompt"]
        for name in ("train", "valid", "test")
        for line in (raw / f"{name}.jsonl").read_text().splitlines()
    ]
    assert len(prompts) == len(set(prompts)) == 90


def test_tokenize_writes_encoded_arrays(arith_out: Path) -> None:
    task = arith_out / "arith"
    manifest = json.loads((task / "encoded" / "manifest.json").read_text())
    tokenizer = load_tokenizer(task / "tokenizer" / "tokenizer.json")
    assert manifest["vocab_size"] == tokenizer.vocab_size and manifest["seq_len"] == 24
    assert manifest["special_ids"] == {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<mask>": 3}
    tokenizer_bytes = (task / "tokenizer" / "tokenizer.json").read_bytes()
    assert manifest["tokenizer_sha256"] == hashlib.sha256(tokenizer_bytes).hexdigest()
    for name in ("train", "valid", "test"):
        entry = manifest["splits"][name]
        payload = (task / "encoded" / f"{name}.npz").read_bytes()
        assert entry["sha256"] == hashlib.sha256(payload).hexdigest()
        with np.load(task / "encoded" / f"{name}.npz") as arrays:
            assert sorted(arrays.files) == ["context_len", "length", "tokens"]
            tokens, length = arrays["tokens"], arrays["length"]
            assert tokens.dtype == np.int32 and tokens.shape == (entry["count"], 24)
        assert entry["count"] + entry["n_dropped"] == {"train": 50}.get(name, 20)
        assert (tokens[:, 0] == 1).all()
        assert (tokens[np.arange(len(tokens)), length - 1] == 2).all()
    assert sum(manifest["splits"][n]["n_dropped"] for n in ("train", "valid", "test")) > 0


def test_tokenize_is_byte_deterministic(arith_out: Path, tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml")
    run(prepare, params, tmp_path / "data", "arith")
    run(tokenize, params, tmp_path / "data", "arith")
    assert files(tmp_path / "data") == files(arith_out)


def test_text_end_to_end_through_the_cli(tmp_path: Path) -> None:
    params, out = write_params(tmp_path / "params.yaml"), tmp_path / "data"
    for stage in ("prepare", "tokenize"):
        cli.main([stage, "--params", str(params), "--task", "text", "--root", str(out.parent)])
    raw = json.loads((out / "text" / "raw" / "manifest.json").read_text())
    assert raw["splits"]["train"]["count"] == 2000 and raw["splits"]["test"]["count"] == 48
    encoded = json.loads((out / "text" / "encoded" / "manifest.json").read_text())
    assert encoded["vocab_size"] == 300
    with np.load(out / "text" / "encoded" / "valid.npz") as arrays:
        assert arrays["tokens"].shape == (encoded["splits"]["valid"]["count"], 64)
        assert (arrays["context_len"] == 1).all() and (arrays["length"] == 64).all()
        assert (arrays["tokens"][:, 0] == 1).all() and (arrays["tokens"][:, 1:] > 3).all()
    first = json.loads((out / "text" / "raw" / "valid.jsonl").read_text().splitlines()[0])
    assert set(first) == {"book", "chapter", "verse", "text"} and first["book"] == "Ruth"


@pytest.mark.parametrize("stage", [prepare, tokenize])
def test_unknown_task_fails_before_any_work(stage: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'poetry'"):
        run(stage, tmp_path / "missing.yaml", tmp_path / "data", "poetry")
    assert not any((tmp_path / "data").rglob("*"))  # nothing written


def test_absent_sections_fail_before_any_work(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml")
    with pytest.raises(ConfigError, match="'gsm' under data"):
        run(prepare, params, tmp_path / "data", "gsm")
    with pytest.raises(ConfigError, match="'gsm' under tokenizer"):
        run(tokenize, params, tmp_path / "data", "gsm")
    assert not any((tmp_path / "data").rglob("*"))  # nothing written
    with pytest.raises(ConfigError, match=r"data\.arith\.n_train"):
        bad = {"n_train": "many", "n_valid": 1, "n_test": 1}
        run(prepare, write_params(tmp_path / "bad.yaml", arith=bad), tmp_path / "data", "arith")


def test_tokenize_before_prepare_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="setdiff prepare"):
        run(tokenize, write_params(tmp_path / "params.yaml"), tmp_path / "data", "arith")


def test_write_atomic_keeps_the_old_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out" / "file.txt"
    write_bytes(path, b"old")
    assert path.read_bytes() == b"old" and (path.stat().st_mode & 0o777) == 0o644

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in path.parent.iterdir()] == ["file.txt"]


def test_tokenize_refuses_an_empty_split(tmp_path: Path) -> None:
    params = json.loads(json.dumps(PARAMS))
    params["tokenizer"]["arith"]["seq_len"] = 4
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run(prepare, tmp_path / "params.yaml", tmp_path / "data", "arith")
    with pytest.raises(ValueError, match="no example fits seq_len=4"):
        run(tokenize, tmp_path / "params.yaml", tmp_path / "data", "arith")


@pytest.mark.parametrize(
    "name", ["backbone", "baseline", "bench", "lmeval", "lossless", "seeds", "setsize"]
)
def test_answer_stages_refuse_a_task_without_answers_first(name: str, tmp_path: Path) -> None:
    """A stage that scores answers names the bad ``--task`` before it reads anything (the
    params file here does not even exist)."""
    import importlib

    stage = importlib.import_module(f"setdiff.stages.{name}")
    argv = ["--params", str(tmp_path / "missing.yaml"), "--task", "text", "--root", str(tmp_path)]
    with pytest.raises(ConfigError, match=r"^--task: 'text' has no answers to score; use \["):
        stage.main(argv)
