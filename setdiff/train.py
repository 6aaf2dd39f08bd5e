"""Training loop shared by every paradigm: AdamW, warmup + cosine, clipping, EMA, resumable.

`train` samples batches from an `ArraySplit` with one seeded generator (which also drives the
paradigm's order/noise sampling), so a run is a deterministic function of its seed. Checkpoints
(model, EMA, optimizer, scheduler, generator state, step) are written atomically every
`checkpoint_every` steps and on SIGTERM; a run restarted with the same checkpoint directory
resumes where it stopped and ends at the same weights as an uninterrupted run.

Data parallel: under ``torchrun`` (an initialised torch.distributed group) the model is wrapped in
DistributedDataParallel and each rank trains on its slice of the same global batch; rank 0 alone
logs and checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from setdiff.artifacts import atomic_path, write_text
from setdiff.batching import ArraySplit
from setdiff.config import check, frozen
from setdiff.model import Transformer
from setdiff.paradigm import Paradigm

log = logging.getLogger(__name__)


@frozen
class TrainConfig:
    steps: int
    """Optimizer steps."""
    batch_size: int = 32
    lr: float = 3e-3
    """Peak learning rate (after warmup)."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor, as a fraction of `lr`."""
    warmup_steps: int = 50
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    """Max global grad norm; 0 disables clipping."""
    ema_decay: float = 0.0
    """EMA of weights (exported instead of the raw weights when > 0); 0 = off."""
    eval_every: int = 100
    """Steps between held-out loss evaluations (and a final one)."""
    eval_examples: int = 256
    """Validation examples per evaluation (the first ones, fixed noise seed)."""
    checkpoint_every: int = 100
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    """bfloat16 = autocast on CUDA (weights and optimizer stay float32)."""
    threads: int = 0
    """torch intra-op threads; 0 = torch's default."""
    attention: Literal["sdpa", "flex"] = "sdpa"
    """Training masks as dense tensors (SDPA) or FlexAttention block masks (block-sparse on GPU)."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        check(0 <= self.ema_decay < 1, "ema_decay must be in [0, 1)")
        check(self.eval_every >= 1 and self.checkpoint_every >= 1, "eval/checkpoint_every >= 1")
        check(self.grad_clip >= 0, "grad_clip must be >= 0")
        check(
            self.attention == "sdpa" or self.device.startswith("cuda"),
            "attention 'flex' needs a CUDA device (FlexAttention has no backward on CPU)",
        )

    def lr_at(self, step: int) -> float:
        """Learning-rate multiplier at `step` (linear warmup, cosine to `min_lr_ratio`)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1)
        cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine


@dataclasses.dataclass(frozen=True, slots=True)
class TrainResult:
    steps: int
    final_train_loss: float
    final_eval_loss: float
    seconds: float
    resumed_from: int
    """Step the run resumed from (0 = fresh)."""
    weights: dict[str, torch.Tensor]
    """Weights to export (EMA when enabled)."""
    train_losses: list[float] = dataclasses.field(default_factory=list)
    """Global training loss of each step run by this call."""


def train(
    net: Transformer,
    paradigm: Paradigm,
    train_split: ArraySplit,
    valid_split: ArraySplit,
    config: TrainConfig,
    *,
    checkpoint_dir: str | Path | None = None,
    log_path: str | Path | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Train `net` with `paradigm`'s loss; resume from `checkpoint_dir` when it holds a state.

    Args:
        on_eval: called with (step, eval_loss) after each evaluation (e.g. for pruning; it may
            raise to stop the run).
        log_path: JSON-lines log of {step, train_loss, eval_loss, lr, seconds}.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    rank, world = rank_and_world()
    check(config.batch_size % world == 0, f"batch_size {config.batch_size} % {world} ranks != 0")
    device = torch.device(config.device)
    net.to(device).train()
    model = _wrap_data_parallel(net, device) if world > 1 else net
    optimizer = torch.optim.AdamW(
        net.parameters(),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_at)
    generator = torch.Generator().manual_seed(config.seed)
    ema = _ema_init(net) if config.ema_decay > 0 else None
    state_path = Path(checkpoint_dir) / "state.pt" if checkpoint_dir else None
    step = _resume(state_path, net, optimizer, scheduler, generator, ema)
    is_main = rank == 0
    if is_main:
        _truncate_log(log_path, step)
    start_step, started, eval_loss = step, time.perf_counter(), math.nan
    train_losses: list[float] = []
    show = show_progress and is_main
    with _sigterm_as_stop() as stop_requested, _progress(config.steps, step, show) as bar:
        while step < config.steps:
            train_loss = _step(model, paradigm, train_split, config, generator, device, rank, world)
            optimizer.step()
            scheduler.step()
            step += 1
            train_losses.append(train_loss)
            if ema is not None:
                _ema_update(ema, net, config.ema_decay)
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.3f}")
            if step % config.eval_every == 0 or step == config.steps:
                eval_loss = evaluate_loss(net, paradigm, valid_split, config, ema)
                if is_main:
                    _log(log_path, step, train_loss, eval_loss, scheduler, started)
                if on_eval is not None:
                    on_eval(step, eval_loss)
            if state_path and is_main and (step % config.checkpoint_every == 0 or stop_requested()):
                _save_state(state_path, step, net, optimizer, scheduler, generator, ema)
            if stop_requested():
                raise KeyboardInterrupt(f"SIGTERM: checkpointed at step {step}")
    if math.isnan(eval_loss):  # resumed from a checkpoint of the final step: nothing ran
        eval_loss = evaluate_loss(net, paradigm, valid_split, config, ema)
    weights = (
        ema if ema is not None else {k: v.detach().clone() for k, v in net.state_dict().items()}
    )
    return TrainResult(
        steps=step,
        final_train_loss=train_losses[-1] if train_losses else math.nan,
        final_eval_loss=eval_loss,
        seconds=time.perf_counter() - started,
        resumed_from=start_step,
        weights=weights,
        train_losses=train_losses,
    )


def _step(
    model: torch.nn.Module,
    paradigm: Paradigm,
    split: ArraySplit,
    config: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    rank: int,
    world: int,
) -> float:
    """Forward/backward of this rank's share of one global batch; returns the global loss.

    Every rank draws the same global batch and noise from the shared generator and keeps its own
    slice, so any number of ranks follows the single-process trajectory (DDP averages gradients
    of equal-size slices, which equals the global mean)."""
    batch = split.sample(config.batch_size, generator)
    noise = paradigm.sample_noise(batch, generator)
    if world > 1:
        share = config.batch_size // world
        index = torch.arange(rank * share, (rank + 1) * share)
        batch, noise = batch.select(index), {k: v[index] for k, v in noise.items()}
    with _autocast(config, device):
        out = paradigm.loss(model, batch.to(device), noise=noise)
    objective = out.loss
    if world > 1:  # the global mean: local sum over the global count, times world (DDP averages)
        n_counted = out.counted.sum()
        torch.distributed.all_reduce(n_counted)
        objective = out.sum_over(n_counted) * world
    model.zero_grad(set_to_none=True)
    objective.backward()
    if config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    loss = objective.detach()
    if world > 1:
        torch.distributed.all_reduce(loss)
        loss = loss / world
    value = float(loss)
    if not math.isfinite(value):
        raise FloatingPointError(f"training loss is {value}; stopping")
    return value


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of an initialised torch.distributed group, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _wrap_data_parallel(net: Transformer, device: torch.device) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(net, device_ids=ids)


@torch.no_grad()
def evaluate_loss(
    net: Transformer,
    paradigm: Paradigm,
    split: ArraySplit,
    config: TrainConfig,
    ema: dict[str, torch.Tensor] | None = None,
) -> float:
    """Mean per-token held-out loss on the first `eval_examples` (fixed noise seed)."""
    backup = None
    if ema is not None:
        backup = {k: v.detach().clone() for k, v in net.state_dict().items()}
        net.load_state_dict(ema)
    net.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    nll, tokens = 0.0, 0
    device = torch.device(config.device)
    for batch in split.iterate(config.batch_size, config.eval_examples):
        with _autocast(config, device):
            out = paradigm.loss(net, batch.to(device), generator)
        nll += float(out.nll_sum.sum())
        tokens += int(out.n_tokens.sum())
    net.train()
    if backup is not None:
        net.load_state_dict(backup)
    return nll / max(tokens, 1)


def _autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if config.dtype == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _ema_init(net: Transformer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float() for k, v in net.state_dict().items()}


@torch.no_grad()
def _ema_update(ema: dict[str, torch.Tensor], net: Transformer, decay: float) -> None:
    for k, v in net.state_dict().items():
        ema[k].mul_(decay).add_(v.float(), alpha=1 - decay)


def _resume(
    path: Path | None,
    net: Transformer,
    optimizer: Any,
    scheduler: Any,
    generator: torch.Generator,
    ema: dict[str, torch.Tensor] | None,
) -> int:
    if path is None or not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=False)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    if ema is not None:
        if state["ema"] is None:
            raise ValueError(f"{path}: checkpoint has no EMA but ema_decay > 0")
        ema.update(state["ema"])
    log.info("resumed from %s at step %d", path, state["step"])
    return int(state["step"])


def _save_state(
    path: Path,
    step: int,
    net: Transformer,
    optimizer: Any,
    scheduler: Any,
    generator: torch.Generator,
    ema: dict[str, torch.Tensor] | None,
) -> None:
    state = {
        "step": step,
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "generator": generator.get_state(),
        "ema": ema,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _log(
    path: str | Path | None,
    step: int,
    train_loss: float,
    eval_loss: float,
    scheduler: Any,
    started: float,
) -> None:
    record = {
        "step": step,
        "train_loss": train_loss,
        "eval_loss": eval_loss,
        "lr": scheduler.get_last_lr()[0],
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info("step %d train %.4f eval %.4f", step, train_loss, eval_loss)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _truncate_log(path: str | Path | None, step: int) -> None:
    """Drop log records past the resumed step (they were written after the last checkpoint)."""
    if path is None or not Path(path).exists():
        return
    lines = Path(path).read_text().splitlines()
    kept = [line for line in lines if line and json.loads(line)["step"] <= step]
    write_text(path, "".join(line + "\n" for line in kept))


@contextlib.contextmanager
def _sigterm_as_stop() -> Iterator[Callable[[], bool]]:
    """Turn SIGTERM into a flag checked between steps (main thread only)."""
    flag = {"stop": False}

    def handler(signum: int, frame: Any) -> None:
        flag["stop"] = True

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield lambda: False
        return
    try:
        yield lambda: flag["stop"]
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _progress(total: int, initial: int, enabled: bool) -> Iterator[Any]:
    bar = tqdm(total=total, initial=initial, disable=not enabled, desc="train", dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
