"""Training state on disk: save, resume and load one run's ``state.pt``, and the weights a run
exports.

A state holds `STATE_KEYS` (model, EMA, optimizer, scheduler, generator state, step) and nothing
else, so it is read back with torch's weights-only unpickler: a file that would run code (a
planted pickle) or a damaged one is refused with a one-line error naming the file. Writes are
atomic (a crash leaves the previous state). Under FSDP the full states are gathered collectively
in the single-process format (`setdiff.distributed`), so a checkpoint resumes under any world
size; the training loop that decides when to save is `setdiff.train`.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from setdiff.distributed import (
    full_optimizer_state,
    gather_full,
    is_sharded,
    load_full_optimizer_state,
    shard_like,
)
from setdiff.files import atomic_path
from setdiff.model import Transformer

log = logging.getLogger(__name__)

STATE_KEYS = ("step", "model", "optimizer", "scheduler", "generator", "ema")
"""What a training state file holds (tensors, numbers, lists and dicts only)."""


def resume_state(
    path: Path | None,
    net: Transformer,
    optimizer: Any,
    scheduler: Any,
    generator: torch.Generator,
    ema: dict[str, torch.Tensor] | None,
) -> int:
    """Load the state at `path` into the run's objects (in place); returns its step, 0 when
    there is no state yet. Under FSDP every rank loads the full state and keeps its shards."""
    if path is None or not path.exists():
        return 0
    state = load_state(path)
    if ema is not None and state["ema"] is None:
        raise ValueError(f"{path}: checkpoint has no EMA but ema_decay > 0")
    if is_sharded(net):
        net.load_state_dict(shard_like(state["model"], net.state_dict()))
        load_full_optimizer_state(net, optimizer, state["optimizer"])
        if ema is not None:
            ema.update(shard_like(state["ema"], ema))
    else:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if ema is not None:
            ema.update(state["ema"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    log.info("resumed from %s at step %d", path, state["step"])
    return int(state["step"])


def load_state(path: Path) -> dict[str, Any]:
    """Read a state file with torch's weights-only unpickler: tensors and plain containers load,
    anything that would run code (a planted pickle) is refused naming the file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path}: refused: it holds more than tensors and plain data ({_unsafe_part(err)}), "
            "and loading it could run code; delete it to start over"
        ) from None
    except Exception as err:  # torch raises RuntimeError, EOFError, ... for a damaged file
        reason = " ".join(str(err).split(". ")[0].split()) or type(err).__name__
        raise ValueError(f"{path}: unreadable training state ({reason}); delete it") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: not a training state (missing {missing}); delete it")
    return state


def _unsafe_part(err: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused (e.g. ``Unsupported global: GLOBAL exec``)."""
    marker = "WeightsUnpickler error:"
    detail = str(err).partition(marker)[2].split(". ")[0].strip() if marker in str(err) else ""
    return " ".join(detail.split()) or "not a torch archive of tensors"


def save_state(
    path: Path,
    step: int,
    net: Transformer,
    optimizer: Any,
    scheduler: Any,
    generator: torch.Generator,
    ema: dict[str, torch.Tensor] | None,
) -> None:
    """Write the training state atomically. Under FSDP every rank calls this (the full states are
    gathered collectively, in the single-process format) and rank 0 writes."""
    if is_sharded(net):
        # Model first: its state-dict hook reshards a root left gathered by an evaluation, and the
        # optimizer state maps parameters to names through the (sharded) registered ones.
        model = gather_full(net.state_dict())
        optim = full_optimizer_state(net, optimizer)
        ema = gather_full(ema) if ema is not None else None
        if torch.distributed.get_rank() != 0:
            return
    else:
        model, optim = net.state_dict(), optimizer.state_dict()
    state = {
        "step": step,
        "model": model,
        "optimizer": optim,
        "scheduler": scheduler.state_dict(),
        "generator": generator.get_state(),
        "ema": ema,
    }
    # Through a Python file: torch's own path writer reports a full disk as "unexpected pos".
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def export_weights(
    net: Transformer, ema: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """The weights to export: the EMA, else a copy of the net's; gathered in full under FSDP."""
    if is_sharded(net):
        return gather_full(ema if ema is not None else net.state_dict())
    return ema if ema is not None else {k: v.detach().clone() for k, v in net.state_dict().items()}
