"""Train one (task, paradigm) model; resumable; writes models/<task>/<paradigm>/.

DVC stages ``train_ar`` and ``train``.

``setdiff train --task arith --paradigm setdlm`` reads ``model.<task>``, ``train.<task>`` and
``paradigm.<paradigm>``; writes ``models/<task>/<paradigm>/`` (weights, config, tokenizer,
``train_log.jsonl``) and ``metrics/train/<task>/<paradigm>.json``. Diffusion paradigms start from
``models/<task>/ar`` when ``train.<task>.init_from_ar`` is true (the paper's recipe); the others
(and ``ar``) start from ``model.<task>.pretrained`` when it names a Hugging Face Llama/Qwen3
checkpoint, else from random weights. Training state is checkpointed under
``checkpoints/<task>/<paradigm>/<run id>/``; re-running after a kill resumes there, and a changed
config starts a fresh run id. A checkpoint made from other inputs (the encoded splits, the
tokenizer or the starting weights changed since; `setdiff.initial.inputs_fingerprint`) is not
resumed: the run starts over and says so in one line. The checkpoint is removed once the model
is exported.

Multi-GPU / multi-node: ``torchrun --nproc_per_node N -m setdiff.cli train --task T --paradigm P``
runs data-parallel (DDP) with the same global batch; rank 0 writes every output.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from setdiff.artifacts import file_weights, run_id, save_model_dir
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError
from setdiff.distributed import rank_and_world
from setdiff.files import atomic_path, finite_or_none, write_json
from setdiff.initial import INPUT_NAMES, initial_source, initial_weights, inputs_fingerprint
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.preset import ModelSpec
from setdiff.preset import model_config as model_config  # the former helper (tests call it)
from setdiff.recipe import CurveConfig, TaskTrainConfig
from setdiff.runtime import host
from setdiff.stages.common import Layout, snapshot_name, start
from setdiff.tasks import ANSWER_TASKS
from setdiff.tokenizer import Tokenizer, load_tokenizer
from setdiff.train import TrainConfig, train

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("model.{task}", "train.{task}", "paradigm.{paradigm}")
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

INPUTS_FILE = "inputs.json"
"""Beside a checkpoint: the `inputs_fingerprint` of the run that writes it."""

_initial_net = initial_weights
"""The former name (tests/test_pretrained.py and test_trust.py call it)."""


def main(argv: list[str]) -> None:
    args, preset, layout = start(
        argv, "Train one (task, paradigm) model; resumable; torchrun-aware.", paradigms=PARADIGMS
    )
    recipe: TaskTrainConfig = preset.section(f"train.{args.task}", TaskTrainConfig)
    config = _with_local_device(recipe.for_paradigm(args.paradigm))
    tokenizer = load_tokenizer(layout.tokenizer)
    train_split = ArraySplit.load(layout.encoded("train"))
    valid_split = ArraySplit.load(layout.encoded("valid"))
    model_spec: ModelSpec = preset.section(f"model.{args.task}")
    net_config = model_spec.config(tokenizer.vocab_size, train_split.seq_len)
    _check_vocabulary(net_config, tokenizer, args.task)
    paradigm_cfg = preset.section(f"paradigm.{args.paradigm}")
    # The starting weights: this task's AR model (a directory) or a pretrained checkpoint (a
    # path or hub id string), else None (random).
    source = initial_source(
        args.paradigm,
        init_from_ar=recipe.init_from_ar,
        ar_model=layout.model("ar"),
        pretrained=model_spec.pretrained,
    )
    net = initial_weights(net_config, config.seed, source, args.task, layout.tokenizer)
    paradigm = make_paradigm(
        args.paradigm, paradigm_cfg, mask_id=tokenizer.mask_id, attention=config.attention
    )
    rid = run_id(net_config, paradigm_cfg, config, str(source), recipe.curve)
    snapshots = layout.checkpoints / rid / "snapshots"
    on_eval = _snapshots(recipe.curve, layout, net, snapshots, preset.path)
    inputs = inputs_fingerprint(train_split, valid_split, layout.tokenizer, source)
    is_main = rank_and_world()[0] == 0
    if is_main:
        _drop_stale_checkpoints(layout, rid, inputs)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank resumes a checkpoint rank 0 is removing
    log.info(
        "%s/%s: %.2fM parameters, run %s", args.task, args.paradigm, net.num_parameters() / 1e6, rid
    )
    log_path = layout.checkpoints / rid / "train_log.jsonl"
    result = train(
        net,
        paradigm,
        train_split,
        valid_split,
        config,
        checkpoint_dir=layout.checkpoints / rid,
        log_path=log_path,
        on_eval=on_eval,
    )
    if not is_main:
        return
    extra = {"task": args.task, "run_id": rid, "init_from": str(source) if source else None}
    save_model_dir(
        layout.model(),
        net,
        paradigm,
        tokenizer_file=layout.tokenizer,
        state_dict=result.weights,
        extra=extra,
        extra_files={"train_log.jsonl": log_path},
    )
    evaluated = [s for s in range(1, config.steps + 1) if s % config.eval_every == 0]
    evaluated += [] if config.steps % config.eval_every == 0 else [config.steps]
    _export_snapshots(snapshots, layout.snapshots, evaluated if on_eval is not None else [])
    # The exported model is the result; the training state was only there to survive a kill.
    shutil.rmtree(layout.checkpoints / rid, ignore_errors=True)
    write_json(
        layout.metrics("train"),
        {
            "task": args.task,
            "paradigm": args.paradigm,
            "steps": result.steps,
            # NaN when a resumed run had no step left to train: null, not bare NaN
            "final_train_loss": finite_or_none(result.final_train_loss),
            "final_eval_loss": result.final_eval_loss,
            "seconds": round(result.seconds, 2),
            "resumed_from": result.resumed_from,
            "parameters": net.num_parameters(),
            "run_id": rid,
            "world_size": rank_and_world()[1],
            "host": host(),  # the weights are reproducible on this kind of host (runtime.host)
        },
    )


def _snapshots(
    curve: CurveConfig, layout: Layout, net: Transformer, directory: Path, params_path: Path | str
) -> Callable[[int, float], None] | None:
    """The `on_eval` callback that keeps the evaluated weights of every evaluation in
    `directory` (``<step>.safetensors``), for the curve stage to decode (or None: no curve).
    The decoding is not done here, so that the sampler is no dependency of training."""
    if curve.n_examples == 0 or rank_and_world()[1] > 1:
        return None
    if layout.task not in ANSWER_TASKS:
        where = f"{params_path}: train.{layout.task}.curve"
        raise ConfigError(f"{where}.n_examples: task {layout.task!r} has no answers to score")

    def on_eval(step: int, eval_loss: float) -> None:
        with atomic_path(directory / snapshot_name(step)) as tmp:
            save_file(file_weights(net), str(tmp))

    return on_eval


def _export_snapshots(directory: Path, out: Path, steps: list[int]) -> None:
    """The run's snapshots of `steps` (the evaluations; none without a curve) as the stage's
    `out`, with ``steps.json``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for step in steps:
        shutil.copyfile(directory / snapshot_name(step), out / snapshot_name(step))
    write_json(out / "steps.json", steps)


def _check_vocabulary(net_config: ModelConfig, tokenizer: Tokenizer, task: str) -> None:
    """Every token id (specials included) needs an embedding row; refuse before any compute."""
    if tokenizer.vocab_size > net_config.vocab_size:
        raise ConfigError(
            f"data/{task}/tokenizer has {tokenizer.vocab_size} ids but the model has "
            f"{net_config.vocab_size} embedding rows (a pretrained model needs its own tokenizer: "
            f"tokenizer.{task}.kind: pretrained)"
        )


def _with_local_device(config: TrainConfig) -> TrainConfig:
    """Under torchrun, join the process group and give each rank its own GPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return config
    cuda = config.device.startswith("cuda")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        return config
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return dataclasses.replace(config, device=f"cuda:{local}")


def _drop_stale_checkpoints(layout: Layout, rid: str, inputs: dict[str, str | None]) -> None:
    """Checkpoints of other configs of this cell can never be resumed: remove them. This run's
    checkpoint is kept only when it was made from the same inputs (data, tokenizer, starting
    weights: `inputs_fingerprint`); else it is removed, saying so in one line. Then `inputs` is
    recorded beside the checkpoint the run will write."""
    if layout.checkpoints.exists():
        for path in layout.checkpoints.iterdir():
            if path.name != rid:
                shutil.rmtree(path, ignore_errors=True)
    directory = layout.checkpoints / rid
    record = directory / INPUTS_FILE
    try:
        stored = json.loads(record.read_text())
    except (OSError, ValueError):  # none yet (a fresh run), or unreadable: start over
        stored = None
    if (directory / "state.pt").exists() and stored != inputs:
        if isinstance(stored, dict):
            changed = [name for key, name in INPUT_NAMES.items() if stored.get(key) != inputs[key]]
            why = f"was made from other inputs ({' / '.join(changed) or 'inputs'} changed)"
        else:
            why = f"has no record of the inputs it was made from ({INPUTS_FILE})"
        log.warning(
            "train %s/%s: checkpoint %s %s; starting over", layout.task, layout.paradigm, rid, why
        )
    if stored != inputs:
        shutil.rmtree(directory, ignore_errors=True)
        write_json(record, inputs)
