"""Trust boundaries: inputs that used to give silent wrong results, run code, or fail unclearly.

Each test feeds one bad input (a swapped checkpoint, a planted pickle, a malformed file, a wrong
argument type) and checks that it is refused before any compute with one line naming the file,
key or argument.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from setdiff import cli
from setdiff.artifacts import LoadedModel, load_model, save_model_dir
from setdiff.config import ConfigError
from setdiff.files import write_bytes
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.sampling.loop import generate
from setdiff.stages import bench, evaluate, tokenize
from setdiff.stages import preset as preset_stage
from setdiff.tasks.records import to_jsonl
from setdiff.tokenizer import (
    DEFAULT_SPECIAL,
    Tokenizer,
    TokenizerConfig,
    load_tokenizer,
    train_tokenizer,
)
from setdiff.train import TrainConfig, train

SMOKE = Path(__file__).parents[1] / "params" / "smoke.yaml"
PAIRS = [(a, b) for a in range(1, 9) for b in range(1, 4)]
ARITH = [
    {
        "prompt": f"{a}+{b}=",
        "target": f"{a}+{b}={a + b} #{a + b}",
        "answer": str(a + b),
        "question": f"{a} + {b} =",
        "entry": {"answer": str(a + b)},
    }
    for a, b in PAIRS
]
VERSES = [
    {"book": "Test", "chapter": 1, "verse": i + 1, "text": text}
    for i, text in enumerate(
        ["In the beginning was the word.", "And the light shined in darkness.", "Jesus wept."] * 20
    )
]
PARAMS: dict[str, Any] = {
    "tokenizer": {
        "arith": {"kind": "char", "seq_len": 16},
        "text": {"kind": "bpe", "vocab_size": 300, "seq_len": 16},
    },
    "evaluate": {"n_likelihood": 4, "n_answers": 0, "batch_size": 4, "threads": 1},
    "decode": {"ar": {}, "setdlm": {"window": 4}},
    "bench": {"run": {"n_examples": 1, "warmup": 0, "threads": 1}, "sweep": {}},
    "study": {"tasks": ["arith"], "paradigms": ["ar", "setdlm"], "diffusion": ["setdlm"]},
}


def make_tokenizer(kind: str) -> Tokenizer:
    if kind == "char":
        texts = [r[k] for r in ARITH for k in ("prompt", "target")]
        return Tokenizer(train_tokenizer(texts, TokenizerConfig(kind="char", seq_len=16)))
    texts = [v["text"] + "\n" for v in VERSES]
    return Tokenizer(
        train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=300, seq_len=16))
    )


def tiny_net(vocab_size: int, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab_size, n_layer=1, n_head=1, n_kv_head=1, d_model=16, d_ff=32, max_seq_len=16
    )
    return Transformer(config).eval()


def save_model(
    directory: Path, tokenizer: Tokenizer, paradigm: str, task: str | None = "arith"
) -> None:
    """A model directory as the train stage writes it (with the task it was trained for)."""
    tokenizer_file = directory.parent / f".{directory.name}.tokenizer.json"
    tokenizer_file.parent.mkdir(parents=True, exist_ok=True)
    tokenizer_file.write_text(tokenizer.to_str())
    save_model_dir(
        directory,
        tiny_net(tokenizer.vocab_size),
        make_paradigm(paradigm, mask_id=tokenizer.mask_id),
        tokenizer_file=tokenizer_file,
        extra={"task": task} if task else None,
    )


def write_raw(root: Path, task: str, records: list[dict[str, Any]]) -> Path:
    raw = root / "data" / task / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (raw / f"{split}.jsonl").write_bytes(to_jsonl(records))
    return raw


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tokenized arith task (through the tokenize stage) and its ar and setdlm models."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    write_raw(tmp_path, "arith", ARITH)
    run_stage(tokenize, tmp_path, "arith")
    tokenizer = load_tokenizer(tmp_path / "data/arith/tokenizer/tokenizer.json")
    for paradigm in ("ar", "setdlm"):
        save_model(tmp_path / "models/arith" / paradigm, tokenizer, paradigm)
    return tmp_path


def run_stage(stage: Any, root: Path, task: str, *extra: str) -> None:
    stage.main(["--params", str(root / "params.yaml"), "--task", task, "--root", str(root), *extra])


def outputs(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for d in ("metrics", "results") for p in (root / d).rglob("*")
    )


# ---------------------------------------------------------------------------------------------
# 1-2: a checkpoint of another paradigm or another task's tokenizer


def test_a_setdlm_model_in_the_ar_directory_is_refused_naming_both(repo: Path) -> None:
    tokenizer = load_tokenizer(repo / "data/arith/tokenizer/tokenizer.json")
    save_model(repo / "models/arith/ar", tokenizer, "setdlm")  # a setdlm model copied over ar
    with pytest.raises(ValueError, match=r"models/arith/ar.*'setdlm'.*'ar'") as err:
        run_stage(evaluate, repo, "arith", "--paradigm", "ar")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"models/arith/ar.*'setdlm'.*'ar'"):
        run_stage(bench, repo, "arith")
    with pytest.raises(ValueError, match="'setdlm'"):
        load_model(repo / "models/arith/ar", paradigm="ar")
    assert outputs(repo) == []


@pytest.mark.parametrize("records_task", [True, False], ids=["task-recorded", "no-task-record"])
def test_a_text_model_in_an_arith_directory_is_refused(repo: Path, records_task: bool) -> None:
    text_tokenizer = make_tokenizer("bpe")
    save_model(
        repo / "models/arith/setdlm", text_tokenizer, "setdlm", "text" if records_task else None
    )
    with pytest.raises(ValueError, match=r"models/arith/setdlm") as err:
        run_stage(evaluate, repo, "arith", "--paradigm", "setdlm")
    assert "\n" not in str(err.value)
    assert "text" in str(err.value) or "data/arith/tokenizer/tokenizer.json" in str(err.value)
    with pytest.raises(ValueError, match=r"models/arith/setdlm"):
        run_stage(bench, repo, "arith")
    with pytest.raises(ValueError, match=r"models/arith/setdlm"):
        load_model(
            repo / "models/arith/setdlm", tokenizer=repo / "data/arith/tokenizer/tokenizer.json"
        )
    assert outputs(repo) == []


def test_matching_models_still_load_and_evaluate(repo: Path) -> None:
    model = load_model(
        repo / "models/arith/setdlm",
        paradigm="setdlm",
        task="arith",
        tokenizer=repo / "data/arith/tokenizer/tokenizer.json",
    )
    assert model.paradigm.config.name == "setdlm"
    run_stage(evaluate, repo, "arith", "--paradigm", "setdlm")
    assert json.loads((repo / "metrics/evaluate/arith/setdlm.json").read_text())["ppl"] > 1


def _nan_model(repo: Path) -> str:
    """Overwrite models/arith/ar with NaN in its first matrix; returns that tensor's name."""
    tokenizer = load_tokenizer(repo / "data/arith/tokenizer/tokenizer.json")
    net = tiny_net(tokenizer.vocab_size)
    name, weight = next((n, p) for n, p in net.named_parameters() if p.dim() == 2)
    with torch.no_grad():
        weight.fill_(float("nan"))
    tokenizer_file = repo / "data/arith/tokenizer/tokenizer.json"
    paradigm = make_paradigm("ar", mask_id=tokenizer.mask_id)
    directory = repo / "models/arith/ar"
    save_model_dir(directory, net, paradigm, tokenizer_file=tokenizer_file, extra={"task": "arith"})
    return name


def test_nan_weights_are_refused_naming_the_model_and_nothing_is_written(repo: Path) -> None:
    name = _nan_model(repo)
    with pytest.raises(
        ValueError, match=rf"models/arith/ar: non-finite weights .* in {name}"
    ) as err:
        run_stage(evaluate, repo, "arith", "--paradigm", "ar")
    assert "\n" not in str(err.value)
    assert outputs(repo) == []


def test_a_non_finite_loss_is_refused_naming_the_model_and_nothing_is_written(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nan_model(repo)
    monkeypatch.setattr(evaluate, "check_finite_weights", lambda model: None)  # the loss guard
    with pytest.raises(ValueError, match=r"models/arith/ar: non-finite loss") as err:
        run_stage(evaluate, repo, "arith", "--paradigm", "ar")
    assert "\n" not in str(err.value)
    assert outputs(repo) == []


def test_train_refuses_to_start_from_a_setdlm_model_in_the_ar_directory(repo: Path) -> None:
    from setdiff.stages import train as train_stage

    tokenizer_file = repo / "data/arith/tokenizer/tokenizer.json"
    save_model(repo / "models/arith/ar", load_tokenizer(tokenizer_file), "setdlm")
    config = tiny_net(load_tokenizer(tokenizer_file).vocab_size).config
    with pytest.raises(ValueError, match=r"models/arith/ar.*'setdlm'.*'ar'"):
        train_stage._initial_net(config, 0, repo / "models/arith/ar", "arith", tokenizer_file)


# ---------------------------------------------------------------------------------------------
# 3, 4, 7: generate's arguments


@pytest.fixture
def loaded() -> LoadedModel:
    tokenizer = make_tokenizer("char")
    net = tiny_net(tokenizer.vocab_size)
    paradigm = make_paradigm("setdlm", mask_id=tokenizer.mask_id)
    return LoadedModel(net=net, paradigm=paradigm, tokenizer=tokenizer, path=Path("m"))


@pytest.fixture
def forwards(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the model's forward calls."""
    calls: list[int] = []
    forward = loaded.net.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(loaded.net, "forward", counted)
    return calls


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stop_strings": "#10"}, "stop_strings.*list"),
        ({"stop_ids": 3}, "stop_ids.*list"),
        ({"stop_ids": ["2"]}, "stop_ids"),
        ({"stop_strings": [7]}, "stop_strings"),
    ],
)
def test_a_scalar_where_a_list_is_expected_is_refused(
    loaded: LoadedModel, forwards: list[int], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        generate(loaded, [1, 5], max_new_tokens=4, **kwargs)
    assert forwards == []


def test_a_text_prompt_is_refused_with_a_hint(loaded: LoadedModel, forwards: list[int]) -> None:
    with pytest.raises(ValueError, match=r"prompt_ids.*token ids.*tokenizer"):
        generate(loaded, "123", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"suffix_ids.*token ids"):
        generate(loaded, [1, 5], max_new_tokens=4, suffix_ids="42")
    assert forwards == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": [1, 99]}, r"prompt_ids.*99.*\[0, \d+\)"),
        ({"prompt_ids": [1, -1]}, r"prompt_ids.*-1"),
        ({"prompt_ids": torch.tensor([1, 10_000])}, r"prompt_ids.*10000"),
        ({"prompt_ids": [1.5]}, r"prompt_ids.*integer"),
        ({"prompt_ids": torch.tensor([1.0, 2.0])}, r"prompt_ids.*integer"),
        ({"suffix_ids": [2, 500]}, r"suffix_ids.*500"),
        ({"max_new_tokens": 2.5}, "max_new_tokens.*integer"),
        ({"max_new_tokens": "4"}, "max_new_tokens.*integer"),
        ({"seed": 0.5}, "seed.*integer"),
        ({"seed": "0"}, "seed.*integer"),
    ],
)
def test_bad_ids_and_numbers_are_refused_before_any_forward(
    loaded: LoadedModel, forwards: list[int], kwargs: dict[str, Any], match: str
) -> None:
    arguments: dict[str, Any] = {"prompt_ids": [1, 5], "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(loaded, arguments.pop("prompt_ids"), **arguments)
    assert forwards == []


def test_good_arguments_still_decode(loaded: LoadedModel) -> None:
    out = generate(loaded, torch.tensor([1, 5]), max_new_tokens=4, stop_ids=[2], seed=3)
    assert 1 <= len(out.tokens) <= 4 and out.nfe >= 1


# ---------------------------------------------------------------------------------------------
# 5: resumable training state


class Planted:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (exec, ("open(__import__('os').environ['PLANTED_MARKER'], 'w').close()",))


def _train_once(checkpoint_dir: Path, steps: int = 2) -> Any:
    split = _copy_split()
    config = TrainConfig(
        steps=steps, batch_size=4, warmup_steps=1, eval_every=steps, eval_examples=4,
        checkpoint_every=1,
    )  # fmt: skip
    return train(
        tiny_net(24), make_paradigm("ar", mask_id=3), split, split, config,
        checkpoint_dir=checkpoint_dir, show_progress=False,
    )  # fmt: skip


def _copy_split() -> Any:
    from setdiff.batching import ArraySplit

    tokens = torch.randint(4, 24, (8, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    return ArraySplit(tokens, torch.full((8,), 2), torch.full((8,), 12))


def test_a_planted_pickle_in_the_training_state_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    state = tmp_path / "ckpt" / "state.pt"
    state.parent.mkdir()
    torch.save({"step": 1, "model": Planted()}, state)
    with pytest.raises(ValueError, match=r"ckpt/state\.pt") as err:
        _train_once(tmp_path / "ckpt")
    assert not marker.exists()
    assert "\n" not in str(err.value)
    state.write_bytes(pickle.dumps(Planted(), protocol=2))  # a bare pickle, not a torch archive
    with pytest.raises(ValueError, match=r"ckpt/state\.pt"):
        _train_once(tmp_path / "ckpt")
    assert not marker.exists()


def test_a_real_training_state_still_resumes(tmp_path: Path) -> None:
    first = _train_once(tmp_path / "ckpt", steps=2)
    again = _train_once(tmp_path / "ckpt", steps=2)
    assert again.resumed_from == 2
    assert all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights)


# ---------------------------------------------------------------------------------------------
# 6: the command line


def test_cli_prints_one_line_and_exits_2_on_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    argv = ["prepare", "--params", str(tmp_path / "nope.yaml"), "--task", "arith"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope.yaml" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_shows_the_traceback_with_debug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["prepare", "--params", str(tmp_path / "nope.yaml"), "--task", "arith"]
    with pytest.raises(ConfigError, match="nope.yaml"):
        cli.main(["--debug", *argv])
    with pytest.raises(ConfigError, match="nope.yaml"):
        cli.main([*argv, "--debug"])
    monkeypatch.setenv("SETDIFF_DEBUG", "1")
    with pytest.raises(ConfigError, match="nope.yaml"):
        cli.main(argv)


def test_cli_keeps_the_traceback_of_internal_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)

    def broken(argv: list[str]) -> None:
        raise RuntimeError("internal bug")

    monkeypatch.setattr("setdiff.stages.prepare.main", broken)
    with pytest.raises(RuntimeError, match="internal bug"):
        cli.main(["prepare", "--task", "arith"])


# ---------------------------------------------------------------------------------------------
# 8: presets


def run_preset(directory: Path, preset: dict[str, Any] | str) -> None:
    text = preset if isinstance(preset, str) else yaml.safe_dump(preset)
    (directory / "bad.yaml").write_text(text)
    out = directory / "params.yaml"
    preset_stage.main(["bad", "--dir", str(directory), "--out", str(out)])


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    text = SMOKE.read_text().replace("seed: 0", "seed: [0", 1)
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'bad.yaml'}:\d+:\d+: ") as err:
        run_preset(tmp_path, text)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "params.yaml").exists()


def test_a_range_error_in_a_preset_names_the_field(tmp_path: Path) -> None:
    preset = yaml.safe_load(SMOKE.read_text())
    preset["data"]["arith"]["n_train"] = 0
    with pytest.raises(ConfigError, match=r"data\.arith.*n_train must be positive, got 0") as err:
        run_preset(tmp_path, preset)
    assert "matches none" not in str(err.value) and "\n" not in str(err.value)


def preset_cli(
    directory: Path, text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """`setdiff preset bad` on `text` through the CLI: its one error line (exit 2, no output)."""
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    (directory / "bad.yaml").write_text(text)
    out = directory / "params.yaml"
    out.write_text("kept: true\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["preset", "bad", "--dir", str(directory), "--out", str(out)])
    assert exit_info.value.code == 2
    assert out.read_text() == "kept: true\n"
    err = capsys.readouterr().err
    assert err.startswith(f"error: {directory / 'bad.yaml'}") and err.count("\n") == 1
    return err


@pytest.mark.parametrize(
    "edit",
    [
        ("seed: 0", "seed: &loop [0, *loop]"),  # an alias loop: no RecursionError later
        ("seed: 0", "seed: &zero 0"),  # an anchor alone
    ],
)
def test_yaml_anchors_and_aliases_in_a_preset_are_refused(
    edit: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = preset_cli(tmp_path, SMOKE.read_text().replace(*edit, 1), capsys, monkeypatch)
    assert re.search(r"bad\.yaml:\d+:\d+: YAML anchors and aliases .* not allowed", err)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (
            ("batch_size: 32", "batch_size: 1e9"),
            r"train\.arith\.ar\.batch_size: expected an integer",
        ),
        (("threads: 1}", "threads: -1}"), r"train\.arith\.ar\.threads: must be >= 0, got -1$"),
        (("warmup_steps: 5", "warmup_steps: 41"), r"train\.arith\.ar: warmup_steps 41 > steps 40"),
        (("device: cpu", "device: banana"), r"bench\.run\.device: 'banana' is not a torch device"),
    ],
)
def test_values_that_would_fail_later_are_refused_by_setdiff_preset(
    edit: tuple[str, str],
    pattern: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = preset_cli(tmp_path, SMOKE.read_text().replace(*edit, 1), capsys, monkeypatch)
    assert re.search(rf"bad\.yaml: {pattern}", err.strip())


@pytest.mark.parametrize(
    ("edit", "cuda", "pattern"),
    [
        (
            ("threads: 1}", "threads: 1, device: cuda}"),
            False,
            r"'cuda' is not available here \(torch\.cuda\.is_available\(\) is False\)",
        ),
        (
            ("threads: 1}", "threads: 1, device: cuda:3}"),
            True,
            r"'cuda:3': this machine has 1 CUDA",
        ),
        (("device: cpu", "device: mps"), False, r"'mps' is not available here"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_by_setdiff_preset(
    edit: tuple[str, str],
    cuda: bool,
    pattern: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    err = preset_cli(tmp_path, SMOKE.read_text().replace(*edit, 1), capsys, monkeypatch)
    key = "bench.run" if "mps" in edit[1] else "train.arith.ar"
    assert re.search(rf"bad\.yaml: {re.escape(key)}\.device: {pattern}", err)


def test_the_gpu_preset_is_refused_without_cuda_and_applies_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = (SMOKE.parent / "gpu.yaml").read_text()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = preset_cli(tmp_path, gpu, capsys, monkeypatch)
    assert re.search(r"bad\.yaml: evaluate\.device: 'cuda' is not available here", err)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    run_preset(tmp_path, gpu)  # the file itself is valid: only this machine lacks CUDA
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == yaml.safe_load(gpu)


def test_a_stage_refuses_a_device_this_machine_lacks_before_loading_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    params = tmp_path / "params.yaml"
    params.write_text(SMOKE.read_text().replace("threads: 1}", "threads: 1, device: cuda}", 1))
    argv = ["--params", str(params), "--task", "arith", "--root", str(tmp_path / "none")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *argv, "--paradigm", "ar"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: {params}: train.arith.ar.device: 'cuda' is not available here " + (
        "(torch.cuda.is_available() is False)\n"
    )


# ---------------------------------------------------------------------------------------------
# 9-10: data files


def test_a_garbage_tokenizer_json_names_the_file(repo: Path) -> None:
    path = repo / "data/arith/tokenizer/tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{path}") as err:
        load_tokenizer(path)
    assert "\n" not in str(err.value)
    (repo / "models/arith/ar/tokenizer.json").write_text("garbage")
    with pytest.raises(ValueError, match="models/arith/ar/tokenizer.json"):
        load_model(repo / "models/arith/ar")


def test_a_non_json_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    raw = write_raw(tmp_path, "arith", ARITH)
    lines = (raw / "valid.jsonl").read_text().splitlines()
    lines[2] = '{"prompt": "1+1=", "target": '
    (raw / "valid.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{raw / 'valid.jsonl'}:3: ") as err:
        run_stage(tokenize, tmp_path, "arith")
    assert "\n" not in str(err.value)


def test_a_record_without_prompt_is_named(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    records = [dict(r) for r in ARITH]
    del records[4]["prompt"]
    raw = write_raw(tmp_path, "arith", records)
    with pytest.raises(ValueError, match=rf"{raw / 'train.jsonl'}:5: .*'prompt'"):
        run_stage(tokenize, tmp_path, "arith")


def test_an_empty_train_split_says_so_and_keeps_old_outputs(repo: Path) -> None:
    data = repo / "data/arith"
    before = {p: p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    (data / "raw/train.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"raw/train\.jsonl.*empty") as err:
        run_stage(tokenize, repo, "arith")
    assert "seq_len" not in str(err.value)
    after = {p: p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    del before[data / "raw/train.jsonl"], after[data / "raw/train.jsonl"]
    assert after == before


def test_a_too_short_text_train_split_says_so(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    raw = write_raw(tmp_path, "text", VERSES)
    (raw / "train.jsonl").write_bytes(to_jsonl(VERSES[:1]))
    with pytest.raises(ValueError, match=r"raw/train\.jsonl.*too short"):
        run_stage(tokenize, tmp_path, "text")
    assert not (tmp_path / "data/text/tokenizer").exists()


def test_a_failed_tokenize_leaves_no_new_tokenizer_beside_old_encodings(repo: Path) -> None:
    data = repo / "data/arith"
    before = {p: p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    longer = [dict(r, prompt="(" + r["prompt"] + ")") for r in ARITH]  # a new alphabet
    write_raw(repo, "arith", longer)
    params = dict(PARAMS, tokenizer={"arith": {"kind": "char", "seq_len": 4}})  # nothing fits
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ValueError, match="seq_len"):
        run_stage(tokenize, repo, "arith")
    after = {p: p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}
    assert {p: b for p, b in after.items() if "raw" not in p.parts} == {
        p: b for p, b in before.items() if "raw" not in p.parts
    }


# ---------------------------------------------------------------------------------------------
# Encoded splits: read only when they match data/<task>/encoded/manifest.json


def _test_split_is_training_rows(encoded: Path) -> None:
    with np.load(encoded / "train.npz") as train_split:
        rows = {k: train_split[k][:5] for k in train_split.files}
    (encoded / "test.npz").write_bytes(tokenize.npz_bytes(rows))


def _truncated(encoded: Path) -> None:
    payload = (encoded / "test.npz").read_bytes()
    (encoded / "test.npz").write_bytes(payload[: len(payload) // 2])


def _truncated_and_listed(encoded: Path) -> None:
    """A damaged file the manifest agrees with: the archive itself cannot be read."""
    _truncated(encoded)
    manifest = json.loads((encoded / "manifest.json").read_text())
    manifest["splits"]["test"]["sha256"] = hashlib.sha256(
        (encoded / "test.npz").read_bytes()
    ).hexdigest()
    (encoded / "manifest.json").write_text(json.dumps(manifest))


def _unlisted(encoded: Path) -> None:
    manifest = json.loads((encoded / "manifest.json").read_text())
    del manifest["splits"]["test"]
    (encoded / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_test_split_is_training_rows, " does not match its manifest (sha256 "),
        (_truncated, " does not match its manifest (sha256 "),
        (_truncated_and_listed, ": unreadable encoded split ("),
        (_unlisted, ": not listed in its manifest "),
    ],
)
def test_an_encoded_split_unlike_its_manifest_is_one_line_before_compute(
    repo: Path,
    damage: Any,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    damage(repo / "data/arith/encoded")
    argv = ["evaluate", "--params", str(repo / "params.yaml"), "--task", "arith"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--root", str(repo), "--paradigm", "ar"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {repo}/data/arith/encoded/test.npz{says}"), err
    assert err.rstrip().endswith("re-run `dvc repro tokenize@arith`"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert outputs(repo) == []


# ---------------------------------------------------------------------------------------------
# 11: disk full


def test_disk_full_while_checkpointing_names_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"no space left on device.*ckpt/state\.pt") as err:
        _train_once(tmp_path / "ckpt")
    assert err.value.errno == errno.ENOSPC
    assert list((tmp_path / "ckpt").iterdir()) == []  # no partial file left behind


def test_disk_full_through_the_cli_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def stage(argv: list[str]) -> None:
        write_bytes(tmp_path / "out.json", b"{}")

    monkeypatch.setattr(os, "fsync", full)
    monkeypatch.setattr("setdiff.stages.prepare.main", stage)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["prepare", "--task", "arith"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no space left on device" in err and "out.json" in err and err.count("\n") == 1


class FullDisk(io.FileIO):
    """A new file on a disk with `room` bytes free: the write that reaches the end is short and
    the next one fails with ENOSPC, as on a real full disk."""

    def __init__(self, path: Path, room: int) -> None:
        super().__init__(path, "w")
        self.room = room

    def write(self, data: Any) -> int:
        free = self.room - self.tell()
        if free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(memoryview(data)[:free])


@pytest.mark.parametrize("room", [0, 2048, 9000, 70_000])
def test_disk_full_inside_torch_save_is_one_line_naming_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    # Wherever the disk fills: past the file's buffer (a large tensor is written around it),
    # torch's archive writer raises RuntimeError("unexpected pos") while handling the OSError.
    from setdiff import checkpoint

    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    net = tiny_net(512)  # a 512 x 16 float32 embedding: 32 KiB
    optimizer = torch.optim.AdamW(net.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def on_full_disk(path: Path, mode: str) -> io.BufferedWriter:
        return io.BufferedWriter(FullDisk(path, room))

    def stage(argv: list[str]) -> None:
        state = tmp_path / "ckpt/state.pt"
        checkpoint.save_state(state, 1, net, optimizer, scheduler, torch.Generator(), None)

    monkeypatch.setattr(checkpoint, "open", on_full_disk, raising=False)
    monkeypatch.setattr("setdiff.stages.prepare.main", stage)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["prepare", "--task", "arith"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no space left on device" in err and "ckpt/state.pt" in err and err.count("\n") == 1
    assert list((tmp_path / "ckpt").iterdir()) == []


# ---------------------------------------------------------------------------------------------
# 12: a model folder whose config or special tokens were edited


def _evaluate_cli(repo: Path, capsys: pytest.CaptureFixture[str], paradigm: str) -> str:
    """The evaluate stage through the `setdiff` command; it must refuse: returns its stderr."""
    argv = ["--params", str(repo / "params.yaml"), "--task", "arith", "--root", str(repo)]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["evaluate", *argv, "--paradigm", paradigm])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_model_config_without_its_model_record_is_one_line(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    path = repo / "models/arith/ar/config.json"
    config = json.loads(path.read_text())
    del config["model"]
    path.write_text(json.dumps(config))
    err = _evaluate_cli(repo, capsys, "ar")
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "models/arith/ar/config.json" in err and "'model'" in err
    assert outputs(repo) == []


def test_a_special_map_swapping_bos_and_eos_is_refused(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    swapped = dict(DEFAULT_SPECIAL, bos_token="<eos>", eos_token="<bos>")
    special = repo / "models/arith/ar/special_tokens_map.json"
    special.write_text(json.dumps(swapped))  # tokenizer.json is still the task's, byte for byte
    err = _evaluate_cli(repo, capsys, "ar")
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "models/arith/ar/special_tokens_map.json" in err and "bos_token" in err
    assert outputs(repo) == []
    special.unlink()  # the roles a tokenizer trained here has: loads again
    load_model(repo / "models/arith/ar", tokenizer=repo / "data/arith/tokenizer/tokenizer.json")
