"""Multi-rank training helpers: the process group's rank, DDP wrapping, FSDP2 sharding, and the
collectives that turn sharded states into full ones and back.

Under ``torchrun`` (an initialised torch.distributed group) `setdiff.train` wraps the model in
DistributedDataParallel, or, with ``parallel: fsdp``, shards it in place with FSDP2
(``fully_shard`` on each block, then the root) for models that do not fit one device. Full
states (weights, EMA, optimizer) are gathered to rank 0 as CPU tensors in the single-process
format, so a checkpoint (`setdiff.checkpoint`) resumes under any world size. Nothing here knows
about losses, paradigms or files; with one process every helper is a no-op or is not called.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from setdiff.model import Transformer


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of an initialised torch.distributed group, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def wrap_data_parallel(net: Transformer, device: torch.device) -> torch.nn.Module:
    """`net` replicated by DistributedDataParallel (gradients all-reduced on backward)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(net, device_ids=ids)


def shard(net: Transformer, device: torch.device, world: int) -> None:
    """Shard `net` in place with FSDP2 over all ranks: each block is one unit (gathered only for
    its own forward/backward), the root keeps the embeddings, final norm and head. FSDP2 moves
    each unit to the mesh's device as it shards it, so the whole model never sits on one GPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in net.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)


def is_sharded(net: torch.nn.Module) -> bool:
    """Whether `net` was sharded by `shard` (its state dict then holds DTensor shards)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(net, FSDPModule)


def gradient_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP's ``no_sync`` for all micro-batches but the last (one all-reduce per step). FSDP
    reduce-scatters every micro-batch: its unsharded gradients are what it avoids keeping."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if sync or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when `flag` is set on any rank (a collective)."""
    value = torch.tensor(int(flag), device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value)


def gather_full(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full CPU copies of a sharded state's tensors on rank 0 (other ranks get {}).

    A collective: every rank calls it with the same keys; one tensor is gathered at a time."""
    from torch.distributed.tensor import DTensor

    is_main = torch.distributed.get_rank() == 0
    full = {}
    for key, value in state.items():
        value = value.full_tensor() if isinstance(value, DTensor) else value
        if is_main:
            full[key] = value.detach().to("cpu", copy=True)
    return full


def shard_like(
    full: dict[str, torch.Tensor], like: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`full` cut into this rank's shards, laid out as the DTensors of `like` (no communication:
    every rank holds `full`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = {}
    for key, ref in like.items():
        value = full[key].to(ref.device, ref.dtype)
        if isinstance(ref, DTensor):
            value = distribute_tensor(value, ref.device_mesh, ref.placements, src_data_rank=None)
        out[key] = value
    return out


def rekey_optimizer_state(state: dict[str, Any], keys: dict[Any, Any]) -> dict[str, Any]:
    """An optimizer state dict with its parameter keys mapped through `keys`.

    Checkpoints hold `Optimizer.state_dict()`'s format (parameters by index); the FSDP
    full-state API speaks parameter names, so FSDP runs translate on the way in and out."""
    return {
        "state": {keys[k]: v for k, v in state["state"].items()},
        "param_groups": [
            {**group, "params": [keys[k] for k in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def _parameter_names(net: torch.nn.Module, optimizer: Any) -> list[str]:
    """The name of each of the optimizer's parameters, by its index in the optimizer state."""
    names = {id(p): name for name, p in net.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(net: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The FSDP optimizer state gathered in full on rank 0, keyed by index (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_optimizer_state_dict(net, optimizer, options=options)
    if not state:  # not rank 0
        return state
    index = {name: i for i, name in enumerate(_parameter_names(net, optimizer))}
    return rekey_optimizer_state(state, index)


def load_full_optimizer_state(net: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Load an index-keyed full optimizer state into FSDP's sharded optimizer (every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = dict(enumerate(_parameter_names(net, optimizer)))
    set_optimizer_state_dict(
        net,
        optimizer,
        rekey_optimizer_state(state, names),
        options=StateDictOptions(full_state_dict=True),
    )
