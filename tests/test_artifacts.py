"""Model directories: save/load round trip, and clear errors for bad checkpoints."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

import setdiff
from setdiff.artifacts import load_model, save_model_dir
from setdiff.files import finite_or_none, write_bytes, write_json
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm

CONFIG = ModelConfig(
    vocab_size=24, n_layer=1, n_head=1, n_kv_head=1, d_model=16, d_ff=32, max_seq_len=32
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    net = Transformer(CONFIG)
    paradigm = make_paradigm("setdlm", SetDLMConfig(set_size=2), mask_id=3)
    save_model_dir(tmp_path / "m", net, paradigm)
    return tmp_path / "m"


def test_round_trip_preserves_weights_paradigm_and_decoding(saved: Path) -> None:
    model = load_model(saved)
    assert model.paradigm.config == SetDLMConfig(set_size=2) and model.paradigm.mask_id == 3
    torch.manual_seed(0)
    reference = Transformer(CONFIG).eval()
    for key, value in reference.state_dict().items():
        assert torch.equal(value, model.net.state_dict()[key])
    a = setdiff.generate(model, [1, 5, 6], max_new_tokens=6, window=4)
    b = setdiff.generate(reference, [1, 5, 6], max_new_tokens=6, window=4, paradigm=model.paradigm)
    assert a.tokens == b.tokens


def test_missing_and_corrupt_files_name_the_problem(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a setdiff model directory"):
        load_model(tmp_path / "nowhere")
    (saved / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable safetensors"):
        load_model(saved)


def test_weights_that_do_not_fit_the_config_are_rejected(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["model"]["d_model"] = 32
    config["model"]["d_ff"] = 64
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not fit the model config"):
        load_model(saved)


def test_unknown_paradigm_in_config_is_rejected(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["paradigm"]["name"] = "gpt9"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown paradigm 'gpt9'"):
        load_model(saved)


def test_saving_over_an_existing_directory_is_atomic(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    net = Transformer(CONFIG)

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("setdiff.artifacts.save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_model_dir(saved, net, make_paradigm("ar", mask_id=3))
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    assert sorted(p.name for p in saved.parent.iterdir()) == ["m"]


def test_write_bytes_is_atomic(tmp_path: Path) -> None:
    write_bytes(tmp_path / "a" / "f.bin", b"x")
    assert (tmp_path / "a" / "f.bin").read_bytes() == b"x"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_write_json_refuses_non_finite_numbers_naming_file_and_key(
    tmp_path: Path, bad: float
) -> None:
    path = tmp_path / "metrics.json"
    path.write_text('{"old": 1}\n')
    data = {"task": "arith", "ci": {"bounds": [1.0, bad]}}
    with pytest.raises(ValueError, match=r"metrics.json: ci\.bounds\[1\] is .*JSON has no NaN"):
        write_json(path, data)
    assert path.read_text() == '{"old": 1}\n'  # nothing written, the old file untouched
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    write_json(path, finite_or_none(data))  # the writer's explicit "not computable"
    assert json.loads(path.read_text()) == {"task": "arith", "ci": {"bounds": [1.0, None]}}


def test_a_full_disk_under_safetensors_names_the_model_directory(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError

    def full(*args: object, **kwargs: object) -> None:  # what safetensors raises on ENOSPC
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr("setdiff.artifacts.save_file", full)
    with pytest.raises(OSError, match=r"no space left on device: '.*/m'") as err:
        save_model_dir(saved, Transformer(CONFIG), make_paradigm("ar", mask_id=3))
    assert err.value.errno == errno.ENOSPC
