"""The active preset as one tree of typed sections: `load_preset(path) -> Preset`, and `validate`.

A `Preset` is the only reader of the raw params mapping (`setdiff.params.Params`): stages call
`load_preset` once and hand its sections to the code that runs. A stage asks for a section by the
key dvc.yaml lists under the stage's params, ``preset.section(f"train.{task}")`` (so the stage's
source names exactly the keys DVC tracks for it; tests/test_params.py checks the two agree); the
typed accessors behind it (`Preset.study`, `Preset.train`, `Preset.model`, `Preset.paradigm`,
`Preset.decode`, `Preset.bench_run`, ...) serve library code. Every error names the params file
and the dotted key.

Why sections are typed on first use (and then kept) rather than all inside `load_preset`: a stage
reads only its own sections, and the presets a stage is run on in tests (and DVC's per-stage
params) hold only those. `validate` builds every section of a full preset; the ``preset`` stage
runs it before any compute. ``model.<task>`` needs the vocabulary and context of the tokenized
data, so it is a `ModelSpec` (the architecture or the pretrained source, read once) whose
`ModelSpec.config` finishes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from setdiff.artifacts import run_id
from setdiff.baselines.config import BaselineConfig
from setdiff.bench.config import BenchRunConfig, configurations, throughput_configurations
from setdiff.config import ConfigError, build
from setdiff.evaluate import ANSWER_TASKS, EvalConfig
from setdiff.lmeval.config import LmevalConfig
from setdiff.measure import Configuration
from setdiff.model import ModelConfig
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.params import DEFAULT_PARAMS, Params, load_params
from setdiff.recipe import TaskTrainConfig
from setdiff.search import validate_ablation
from setdiff.study import BackboneStudyConfig, StudyConfig
from setdiff.tasks import TASKS, DataConfig
from setdiff.textgen import TextGenConfig
from setdiff.tokenizer import TokenizerConfig

T = TypeVar("T")

TOP_LEVEL = (
    "preset",
    "study",
    "data",
    "tokenizer",
    "model",
    "paradigm",
    "train",
    "evaluate",
    "decode",
    "bench",
    "textgen",
    "baseline",
    "ablation",
    "backbone",
    "lmeval",
)
"""Every top-level key a preset may hold (each is read by some stage)."""


_PLAIN = {
    "study": "study",
    "data.seed": "data_seed",
    "evaluate": "evaluate",
    "bench.run": "bench_run",
    "bench.tasks": "bench_tasks",
    "baseline": "baseline",
    "textgen": "textgen",
    "lmeval": "lmeval",
    "backbone": "backbone",
}
"""`Preset.section` keys -> the property that builds them."""
_KEYED = ("data", "tokenizer", "model", "train", "paradigm", "decode")
"""`Preset.section` heads of per-task and per-paradigm keys (``train.<task>``) -> the method."""


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """``model.<task>``: an architecture (`ModelConfig` fields without the derived vocabulary
    and context) or ``pretrained``, a Hugging Face checkpoint directory or hub id."""

    architecture: Mapping[str, Any]
    """The section's `ModelConfig` fields (empty when `pretrained` is set)."""
    pretrained: str | None
    where: str
    """``<params file>: model.<task>``, for errors."""

    def config(self, vocab_size: int, seq_len: int) -> ModelConfig:
        """The architecture with the vocabulary and context derived from the tokenized data, or
        the config of the pretrained checkpoint (its own vocabulary)."""
        if self.pretrained is not None:
            from setdiff.hf import pretrained_config

            return pretrained_config(self.pretrained, seq_len)
        derived = sorted({"vocab_size", "max_seq_len"} & set(self.architecture))
        if derived:
            raise ConfigError(
                f"{self.where}: {derived} are derived from the tokenizer and seq_len; remove them"
            )
        fields = {**self.architecture, "vocab_size": vocab_size, "max_seq_len": seq_len}
        return build(ModelConfig, fields, self.where)


def model_spec(section: Any, where: str) -> ModelSpec:
    """Read ``model.<task>`` once.

    Raises:
        ConfigError: if other keys sit beside ``pretrained`` (the checkpoint fixes the
            architecture) or ``pretrained`` is not a non-empty string.
    """
    if not isinstance(section, dict) or "pretrained" not in section:
        return ModelSpec(architecture=dict(section), pretrained=None, where=where)
    others = sorted(set(section) - {"pretrained"})
    if others:
        raise ConfigError(f"{where}: {others} come from the pretrained checkpoint; remove them")
    source = section["pretrained"]
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{where}.pretrained: expected a path or hub id")
    return ModelSpec(architecture={}, pretrained=source, where=where)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A parsed preset: typed sections, each built once on first use."""

    params: Params
    """The raw mapping (for `digest` and the library code that resolves ablation trials)."""
    _built: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def path(self) -> Path:
        return self.params.path

    def __contains__(self, key: object) -> bool:
        return key in self.params

    def _section(self, dotted: str, cls: type[T]) -> T:
        if dotted not in self._built:
            self._built[dotted] = self.params.section(dotted, cls)
        return self._built[dotted]

    @property
    def name(self) -> str:
        """``preset`` (the preset's name), else the params file's stem."""
        return str(self.params.get("preset", self.path.stem))

    @property
    def study(self) -> StudyConfig:
        return self._section("study", StudyConfig)

    @property
    def data_seed(self) -> int:
        """``data.seed`` as an int; `ConfigError` naming the key otherwise."""
        seed = self.params.get_path("data.seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{self.path}: data.seed: expected an integer, got {seed!r}")
        return seed

    def data(self, task: str) -> Any:
        """``data.<task>``: the task generator's own config record."""
        return self._section(f"data.{task}", TASKS[task].config)

    def tokenizer(self, task: str) -> TokenizerConfig:
        return self._section(f"tokenizer.{task}", TokenizerConfig)

    def model(self, task: str) -> ModelSpec:
        key = f"model.{task}"
        if key not in self._built:
            self._built[key] = model_spec(self.params.get_path(key), f"{self.path}: {key}")
        return self._built[key]

    def train(self, task: str) -> TaskTrainConfig:
        return self._section(f"train.{task}", TaskTrainConfig)

    def paradigm(self, name: str) -> Any:
        """``paradigm.<name>``: the paradigm's config record (`PARADIGMS`)."""
        return self._section(f"paradigm.{name}", PARADIGMS[name][0])

    def decode(self, name: str) -> dict[str, Any]:
        """``decode.<name>``: the paradigm's decode options (a fresh dict; may be empty)."""
        return dict(self.params.get_path(f"decode.{name}") or {})

    @property
    def evaluate(self) -> EvalConfig:
        return self._section("evaluate", EvalConfig)

    @property
    def bench_run(self) -> BenchRunConfig:
        return self._section("bench.run", BenchRunConfig)

    @property
    def bench_tasks(self) -> list[str]:
        return list(self.params.get_path("bench.tasks"))

    def bench_configurations(self, paradigms: tuple[str, ...]) -> list[Configuration]:
        """Every configuration of ``bench.sweep`` over ``decode`` for `paradigms`."""
        sweep = self.params.get_path("bench.sweep")
        return configurations(sweep, self.decode, paradigms, str(self.path))

    @property
    def baseline(self) -> BaselineConfig:
        return self._section("baseline", BaselineConfig)

    @property
    def textgen(self) -> TextGenConfig:
        return self._section("textgen", TextGenConfig)

    @property
    def lmeval(self) -> LmevalConfig:
        return self._section("lmeval", LmevalConfig)

    @property
    def backbone(self) -> BackboneStudyConfig:
        return self._section("backbone", BackboneStudyConfig)

    def section(self, key: str) -> Any:
        """The typed section at `key`, named as dvc.yaml lists a stage's params (``train.arith``,
        ``decode.setdlm``, ``bench.run``, ``data.seed``): what the accessor of that key returns."""
        head, _, rest = key.partition(".")
        if key in _PLAIN:
            return getattr(self, _PLAIN[key])
        if head in _KEYED and rest:
            return getattr(self, head)(rest)
        raise ConfigError(f"{self.path}: {key}: not a preset section")

    def digest(self, *keys: str) -> str:
        """`run_id` of the raw sections at `keys` (the params hash recorded in fingerprints)."""
        return run_id(*(self.params.get_path(key) for key in keys))


def model_config(params: Params, task: str, vocab_size: int, seq_len: int) -> ModelConfig:
    """`ModelSpec.config` of ``model.<task>`` in `params` (a one-off read, for tests and tools)."""
    return Preset(params).model(task).config(vocab_size, seq_len)


def load_preset(path: str | Path = DEFAULT_PARAMS) -> Preset:
    """Parse a params file (the active preset by default) into a `Preset`."""
    return Preset(load_params(path))


def validate(params: Params | Preset) -> StudyConfig:
    """Build every section of a preset; raise `ConfigError` naming the first bad key."""
    preset = params if isinstance(params, Preset) else Preset(params)
    path = preset.path
    unknown = sorted(set(preset.params) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {unknown}; known {TOP_LEVEL}")
    study = preset.study
    preset.params.section("data", DataConfig)
    preset.evaluate  # noqa: B018 (built for its errors)
    for task in study.tasks:
        if preset.params.get_path("data").get(task) is None:
            raise ConfigError(f"{path}: data.{task} is missing (study.tasks lists {task})")
        preset.tokenizer(task)
        model = preset.model(task)
        if model.pretrained is None:  # a checkpoint is only read by its stages
            model.config(vocab_size=8, seq_len=8)
        preset.train(task)
    for name in study.paradigms:
        _check_decode(preset, name, preset.decode(name), f"decode.{name}")
    answer_only = [
        t for t in (*study.floor, *study.ablate, *study.backbone) if t not in ANSWER_TASKS
    ]
    if answer_only:
        raise ConfigError(
            f"{path}: study.floor/ablate/backbone: {answer_only} have no checkable "
            f"answers ({sorted(ANSWER_TASKS)})"
        )
    if "backbone" in preset or study.backbone:
        preset.backbone  # noqa: B018
    if study.ablate and "ablation" not in preset:
        raise ConfigError(f"{path}: study.ablate lists {list(study.ablate)}: add ablation")
    _validate_bench(preset, study)
    preset.baseline  # noqa: B018
    if study.textgen:
        preset.textgen  # noqa: B018
    _validate_lmeval(preset, study)
    if "ablation" in preset:
        validate_ablation(preset.params, study)
    extra = sorted(set(preset.params.get_path("paradigm")) - set(PARADIGMS))
    if extra:
        raise ConfigError(f"{path}: paradigm: unknown paradigm(s) {extra}")
    return study


def _check_decode(preset: Preset, name: str, options: Mapping[str, Any], where: str) -> None:
    paradigm = make_paradigm(name, preset.paradigm(name), mask_id=0)
    try:
        paradigm.decode_policy(dict(options))
    except ValueError as err:
        raise ConfigError(f"{preset.path}: {where}: {err}") from None


def _validate_lmeval(preset: Preset, study: StudyConfig) -> None:
    """``lmeval`` (required by dvc.yaml's ``foreach: ${lmeval.tasks}``; ``tasks: []`` = off)."""
    lmeval = preset.lmeval
    bad = [t for t in lmeval.tasks if t not in study.tasks or t not in ANSWER_TASKS]
    if bad:
        raise ConfigError(
            f"{preset.path}: lmeval.tasks: {bad} must be study tasks with answers "
            f"({sorted(ANSWER_TASKS)})"
        )
    outside = [p for p in lmeval.paradigms if p not in study.paradigms]
    if outside:
        raise ConfigError(f"{preset.path}: lmeval.paradigms: {outside} not in study.paradigms")


def _validate_bench(preset: Preset, study: StudyConfig) -> None:
    run = preset.bench_run
    configs = preset.bench_configurations(study.paradigms)
    throughput_configurations(configs, run.throughput.configs, str(preset.path))
    for task in preset.bench_tasks:
        if task not in study.tasks or task not in ANSWER_TASKS:
            raise ConfigError(
                f"{preset.path}: bench.tasks: {task!r} must be a study task with "
                f"answers ({sorted(ANSWER_TASKS)})"
            )
    for config in configs:
        where = f"bench.sweep.{config.paradigm} ({config.label})"
        _check_decode(preset, config.paradigm, config.options, where)
