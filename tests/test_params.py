"""Presets, params validation and the dvc.yaml <-> params contract."""

from __future__ import annotations

import copy
import importlib
import re
from pathlib import Path

import pytest
import yaml

from setdiff.config import ConfigError, build, to_dict
from setdiff.params import Params, load_params
from setdiff.stages import preset
from setdiff.study import StudyConfig

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "params").glob("*.yaml"))


def test_the_three_presets_exist() -> None:
    assert {"smoke", "default", "gpu"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates(name: str) -> None:
    study = preset.validate(load_params(ROOT / "params" / f"{name}.yaml"))
    assert "ar" in study.paradigms


def _mutated(tmp_path: Path, edit) -> Params:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    data = copy.deepcopy(data)
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_params(path)


BAD = {
    "unknown top-level key": (lambda d: d.update(trian={}), r"unknown top-level key.*trian"),
    "unknown train key": (
        lambda d: d["train"]["arith"]["ar"].update(lrr=0.1),
        r"train\.arith.*unknown key.*lrr",
    ),
    "wrong type": (
        lambda d: d["train"]["arith"]["ar"].update(steps="many"),
        r"train\.arith.*steps",
    ),
    "bad value": (lambda d: d["train"]["arith"]["ar"].update(lr=-1.0), r"lr must be > 0"),
    "D < 1": (lambda d: d["paradigm"]["setdlm"].update(set_size=0), r"paradigm\.setdlm.*set_size"),
    "W > s_max": (lambda d: d["decode"]["setdlm"].update(window=9), r"decode\.setdlm.*s_max"),
    "tau out of range": (
        lambda d: d["decode"]["setdlm"].update(threshold=1.5),
        r"decode\.setdlm.*threshold",
    ),
    "window a bool": (
        lambda d: d["decode"]["setdlm"].update(window=True),
        r"decode\.setdlm.*window must be an int",
    ),
    "temperature not finite": (
        lambda d: d["decode"]["ar"].update(temperature=float("inf")),
        r"decode\.ar.*temperature must be a finite number",
    ),
    "unknown decode option": (
        lambda d: d["decode"]["ar"].update(windw=2),
        r"decode\.ar.*unknown decode option",
    ),
    "unknown paradigm": (
        lambda d: d["study"].update(paradigms=["ar", "gpt"], diffusion=["gpt"]),
        r"unknown paradigms",
    ),
    "unknown task": (lambda d: d["study"].update(tasks=["arith", "poetry"]), r"unknown task"),
    "derived model key": (
        lambda d: d["model"]["arith"].update(vocab_size=12),
        r"model\.arith.*vocab_size",
    ),
    "bad data value": (lambda d: d["data"]["arith"].update(n_train=-3), r"n_train"),
    "missing section": (lambda d: d["tokenizer"].pop("text"), r"'text' under tokenizer"),
    "bad tokenizer kind": (lambda d: d["tokenizer"]["arith"].update(kind="word"), r"kind"),
    "diffusion list mismatch": (
        lambda d: d["study"].update(diffusion=["mdlm"]),
        r"diffusion must list",
    ),
    # bounds declared in the config records' types (`setdiff.config.Bounds`), naming the key
    "threads below 0": (
        lambda d: d["train"]["arith"]["ar"].update(threads=-1),
        r"train\.arith\.ar\.threads: must be >= 0, got -1$",
    ),
    "threads below 0 in a paradigm's override": (
        lambda d: d["train"]["arith"].update(paradigms={"setdlm": {"threads": -1}}),
        r"train\.arith: paradigms\.setdlm\.threads: must be >= 0, got -1$",
    ),
    "no eval examples": (
        lambda d: d["train"]["text"]["ar"].update(eval_examples=0),
        r"train\.text\.ar\.eval_examples: must be >= 1, got 0$",
    ),
    "beta2 of 1": (
        lambda d: d["train"]["arith"]["ar"].update(beta2=1.0),
        r"train\.arith\.ar\.beta2: must be < 1, got 1\.0$",
    ),
    "warmup longer than training": (
        lambda d: d["train"]["arith"]["diffusion"].update(warmup_steps=21),
        r"train\.arith\.diffusion: warmup_steps 21 > steps 20",
    ),
    "negative seed": (lambda d: d["evaluate"].update(seed=-1), r"evaluate\.seed: must be >= 0"),
    "norm_eps of 0": (
        lambda d: d["model"]["arith"].update(norm_eps=0),
        r"model\.arith\.norm_eps: must be > 0, got 0",
    ),
    "unknown device": (
        lambda d: d["bench"]["run"].update(device="banana"),
        r"bench\.run\.device: 'banana' is not a torch device",
    ),
    "vllm concurrency 0": (
        lambda d: d["baseline"]["vllm"].update(concurrency=[1, 0]),
        r"baseline\.vllm\.concurrency\[1\]: must be >= 1, got 0",
    ),
    # counts within the task's splits (data.arith: n_train 2000, n_valid 100)
    "batch larger than the train split": (
        lambda d: d["train"]["arith"]["ar"].update(batch_size=10**9),
        r"train\.arith\.ar\.batch_size: 1000000000 is more than the 2000 train examples of "
        r"data\.arith \(n_train\)",
    ),
    "eval examples beyond the valid split": (
        lambda d: d["train"]["arith"]["diffusion"].update(eval_examples=101),
        r"train\.arith\.diffusion\.eval_examples: 101 is more than the 100 valid",
    ),
    "curve beyond the valid split": (
        lambda d: d["train"]["arith"]["curve"].update(n_examples=500),
        r"train\.arith\.curve\.n_examples: 500 is more than the 100 valid",
    ),
    "bench selection beyond the valid split": (
        lambda d: d["bench"]["run"].update(n_select=101),
        r"bench\.run\.n_select: 101 is more than the 100 valid examples of data\.arith",
    ),
    "ablation trials shorter than the warm-up": (
        lambda d: d["ablation"]["budget"].update(train_steps=4),
        r"ablation\.budget\.train_steps: 4 < the warmup_steps 5 of train\.arith",
    ),
    "lmeval threads below 0": (
        lambda d: d["lmeval"].update(threads=-2),
        r"lmeval\.threads: must be >= 0, got -2",
    ),
    # a stage's study list: declared by the stage (setdiff/stages/<stage>.py: STUDY, ...)
    "misspelt study list": (
        lambda d: d["study"].update(lossles=["arith"]),
        r"study: unknown key\(s\) \['lossles'\]; known \[.*'lossless'",
    ),
    "study list beyond the tasks": (
        lambda d: d["study"].update(setsize=["gsm"]),
        r"study: setsize: \['gsm'\] not in tasks \['arith', 'text'\]$",
    ),
    "study list of a task without answers": (
        lambda d: d["study"].update(lossless=["arith", "text"]),
        r"study\.lossless: \['text'\] have no checkable answers",
    ),
    "textgen on an answer task": (
        lambda d: d["study"].update(textgen=["arith"]),
        r"study\.textgen: \['arith'\] are not text \(stream\) tasks$",
    ),
    "floor without setdlm": (
        lambda d: d["study"].update(paradigms=["ar", "mdlm"], diffusion=["mdlm"]),
        r"study\.floor lists \['arith'\]: floor needs \['setdlm'\] in study\.paradigms$",
    ),
    "a stage's section missing": (
        lambda d: d["study"].update(seeds=["arith"]),
        r"missing key 'seeds' under <top>",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_params_fail_naming_the_key(case: str, tmp_path: Path) -> None:
    edit, pattern = BAD[case]
    with pytest.raises(ConfigError, match=pattern):
        preset.validate(_mutated(tmp_path, edit))


def test_the_study_keeps_its_stage_lists_as_params_spell_them() -> None:
    """``study.<stage>`` keys are the stage lists (`StudyConfig.stage_tasks`, a `rest` field):
    built and written back under their own names."""
    params = load_params(ROOT / "params" / "default.yaml")
    study = params.section("study", StudyConfig)
    assert study.tasks_for("lossless") == ("arith",) and study.tasks_for("nothing") == ()
    assert to_dict(study) == params.get_path("study")
    with pytest.raises(ConfigError, match=r"default\.yaml: study\.floor\[0\]: expected a string"):
        build(StudyConfig, {"tasks": ["arith"], "floor": [1]}, "params/default.yaml: study")


def test_preset_command_writes_params_and_rejects_unknown(tmp_path: Path) -> None:
    out = tmp_path / "params.yaml"
    preset.main(["smoke", "--dir", str(ROOT / "params"), "--out", str(out)])
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(
        (ROOT / "params/smoke.yaml").read_text()
    )
    with pytest.raises(ConfigError, match="unknown preset 'nope'.*smoke"):
        preset.main(["nope", "--dir", str(ROOT / "params"), "--out", str(out)])


def test_committed_params_yaml_is_the_default_preset() -> None:
    active = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert active == yaml.safe_load((ROOT / "params/default.yaml").read_text())


def _stage_params() -> dict[str, list[str]]:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    return {name: stage.get("do", stage).get("params", []) for name, stage in dvc["stages"].items()}


def _reads(module: str) -> set[str]:
    """Params keys a stage module reads, with every formatted part written as X."""
    source = (ROOT / module).read_text()
    # a field read off the section (``section("study").tasks``) is that key: ``study.tasks``
    found = re.findall(
        r'(?:section|get_path)\(\s*f?"([a-z_.{}]+)"(?:\)\.([a-z_]+)\b(?!\())?', source
    )
    keys = {f"{key}.{field}" if field else key for key, field in found}
    if "model_config(" in source:
        keys.add("model.{task}")
    if "paradigm_config(" in source:
        keys.add("paradigm.{name}")
    return {re.sub(r"\{.*?\}", "X", k) for k in keys}


def _stage_module(name: str) -> tuple[str, dict[str, str]]:
    """The module a DVC stage runs (from its cmd) and the arguments its keys are formatted with."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][name]
    cmd = stage.get("do", stage)["cmd"]
    found = re.match(r"(?:setdiff (\S+)|python -m (\S+))", cmd)
    assert found, f"{name}: cannot tell the module of {cmd!r}"
    module = f"setdiff.stages.{found.group(1)}" if found.group(1) else found.group(2)
    names = {"task": r"\$\{item(?:\.task)?\}", "paradigm": r"\$\{item\.paradigm\}"}
    fixed = {k: m.group(1) for k in names if (m := re.search(rf"--{k} (\w+)\b", cmd))}
    return module, {k: fixed.get(k, "X") for k in names}


@pytest.mark.parametrize("stage", sorted(_stage_params()))
def test_every_stage_declares_the_params_its_dvc_stage_lists(stage: str) -> None:
    """Each stage module's ``PARAMS`` (its params keys as data) equals its DVC stage's params,
    and covers every key its source reads by name (``section``/``get_path`` literals)."""
    module, args = _stage_module(stage)
    declared = importlib.import_module(module).PARAMS
    listed = {re.sub(r"\$\{.*?\}", "X", k) for k in _stage_params()[stage]}
    assert {k.format(**args) for k in declared} == listed
    patterns = {k.format(task="X", paradigm="X") for k in declared}
    path = ROOT / (module.replace(".", "/") + ".py")
    unread = {
        k
        for k in _reads(str(path.relative_to(ROOT)))
        if not any(k == p or k.startswith(f"{p}.") for p in patterns)
    }
    assert not unread, f"{module} reads {sorted(unread)} beyond its PARAMS"
