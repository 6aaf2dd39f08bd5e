"""The active preset as one tree of typed sections: `load_preset(path) -> Preset`.

A `Preset` is the only reader of the raw params mapping (`setdiff.params.Params`) for the stages:
a stage calls `load_preset` once and hands its sections to the code that runs. It asks for a
section by the key dvc.yaml lists under the stage's params and, for a stage's own section, the
config record that types it: ``preset.section(f"train.{task}", TaskTrainConfig)`` (so the
stage's source names exactly the keys DVC tracks for it; tests/test_params.py checks the two
agree). The sections every stage shares are typed here: ``study``, ``data.seed``,
``data.<task>``, ``model.<task>`` (a `ModelSpec`), ``paradigm.<name>``, ``decode.<name>``,
``bench.tasks`` and ``bench.sweep``. Every error names the params file and the dotted key. A check
sections share lives here too (`Preset.check_counts`), for `setdiff.validate` and the stages'
own ``check_preset`` (decode options are checked by `setdiff.sampling.policies.check_decode`:
the sampler is no dependency of the stages that do not decode).

Why a stage passes its own config class: this module then imports none of the stages' configs,
so a stage's DVC deps (the modules it imports) stay its own, and editing, say, the textgen
config does not re-run training. Why sections are typed on first use (and then kept), not all
inside `load_preset`: a stage reads only its own sections, and the presets a stage is run on in
tests (and DVC's per-stage params) hold only those. `setdiff.validate` builds every section of a
full preset; the ``preset`` stage runs it before any compute. ``model.<task>`` needs the
vocabulary and context of the tokenized data, so it is a `ModelSpec` (the architecture or the
pretrained source, read once) whose `ModelSpec.config` finishes it.

`load_preset` reads the preset a process runs: each section it types has its ``device`` keys
checked against this machine (``cuda`` without CUDA is refused naming the key, before any
compute). A `Preset` built directly from `Params` is plain data (`setdiff.validate` of a GPU
preset on a CPU machine, ``setdiff promote``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from setdiff.artifacts import run_id
from setdiff.config import ConfigError, build, to_dict
from setdiff.model import ModelConfig
from setdiff.paradigm import PARADIGMS
from setdiff.params import DEFAULT_PARAMS, Params, load_params
from setdiff.runtime import unavailable
from setdiff.study import StudyConfig
from setdiff.tasks import TASKS

T = TypeVar("T")

_SHARED = {
    "study": "study",
    "data.seed": "data_seed",
    "bench.tasks": "bench_tasks",
    "bench.sweep": "bench_sweep",
}
"""`Preset.section` keys typed here -> the property that builds them."""
_KEYED = ("data", "model", "paradigm", "decode")
"""`Preset.section` heads of per-task and per-paradigm keys (``model.<task>``) -> the method."""


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
    on_machine: bool = False
    """Check each typed section's ``device`` keys against this machine (`load_preset`)."""
    _built: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def path(self) -> Path:
        return self.params.path

    def __contains__(self, key: object) -> bool:
        return key in self.params

    def _section(self, dotted: str, cls: type[T]) -> T:
        if dotted not in self._built:
            section = self.params.section(dotted, cls)
            if self.on_machine:
                self._check_devices(to_dict(section), dotted)
            self._built[dotted] = section
        return self._built[dotted]

    def _check_devices(self, node: Any, where: str) -> None:
        """`ConfigError` naming the first ``device`` key under `node` this machine lacks."""
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            if key == "device" and isinstance(value, str) and (why := unavailable(value)):
                raise ConfigError(f"{self.path}: {where}.device: {why}")
            self._check_devices(value, f"{where}.{key}")

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

    def model(self, task: str) -> ModelSpec:
        key = f"model.{task}"
        if key not in self._built:
            self._built[key] = model_spec(self.params.get_path(key), f"{self.path}: {key}")
        return self._built[key]

    def paradigm(self, name: str) -> Any:
        """``paradigm.<name>``: the paradigm's config record (`PARADIGMS`)."""
        return self._section(f"paradigm.{name}", PARADIGMS[name][0])

    def decode(self, name: str) -> dict[str, Any]:
        """``decode.<name>``: the paradigm's decode options (a fresh dict; may be empty)."""
        return dict(self.params.get_path(f"decode.{name}") or {})

    @property
    def bench_tasks(self) -> list[str]:
        return list(self.params.get_path("bench.tasks"))

    @property
    def bench_sweep(self) -> Mapping[str, Any]:
        """``bench.sweep``: the decode options swept per paradigm (raw; `setdiff.bench.config`
        types it with the ``decode`` defaults)."""
        return self.params.get_path("bench.sweep")

    def section(self, key: str, cls: type[T] | None = None) -> Any:
        """The typed section at `key`, named as dvc.yaml lists a stage's params (``train.arith``,
        ``decode.setdlm``, ``bench.run``, ``data.seed``): built with `cls` when given (a stage's
        own section), else by this module's accessor of that key (the shared sections)."""
        if cls is not None:
            return self._section(key, cls)
        head, _, rest = key.partition(".")
        if key in _SHARED:
            return getattr(self, _SHARED[key])
        if head in _KEYED and rest:
            return getattr(self, head)(rest)
        raise ConfigError(f"{self.path}: {key}: give the config class that types this section")

    def check_counts(
        self, task: str, key: str, record: Any, counts: tuple[tuple[str, str], ...]
    ) -> None:
        """Each ``(field, split)`` of `record` (the section at `key`) is at most the size of
        `task`'s split where the preset fixes it (``data.<task>.n_<split>``): more examples than
        a split holds, or a batch larger than the train split, is a typo that fails or silently
        runs on fewer. (The counts of sections shared by all tasks, such as
        ``evaluate.n_likelihood``, are caps: each task takes at most that many and records how
        many it took.)"""
        sizes = to_dict(self.data(task))
        for field, split in counts:
            size, value = sizes.get(f"n_{split}"), operator.attrgetter(field)(record)
            if size is not None and value > size:
                raise ConfigError(
                    f"{self.path}: {key}.{field}: {value} is more than the {size} {split} "
                    f"examples of data.{task} (n_{split})"
                )

    def digest(self, *keys: str) -> str:
        """`run_id` of the raw sections at `keys` (the params hash recorded in fingerprints)."""
        return run_id(*(self.params.get_path(key) for key in keys))


def model_config(params: Params, task: str, vocab_size: int, seq_len: int) -> ModelConfig:
    """`ModelSpec.config` of ``model.<task>`` in `params` (a one-off read, for tests and tools)."""
    return Preset(params).model(task).config(vocab_size, seq_len)


def load_preset(path: str | Path = DEFAULT_PARAMS) -> Preset:
    """Parse a params file (the active preset by default) into the `Preset` this process runs
    (its devices checked against this machine as its sections are read)."""
    return Preset(load_params(path), on_machine=True)
