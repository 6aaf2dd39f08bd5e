"""Training loop shared by every paradigm: AdamW, warmup + cosine, clipping, EMA, resumable.

`train` samples batches from an `ArraySplit` with one seeded generator (which also drives the
paradigm's order/noise sampling), so a run is a deterministic function of its seed. Checkpoints
(model, EMA, optimizer, scheduler, generator state, step; `setdiff.checkpoint`) are written
atomically every `checkpoint_every` steps and on SIGTERM; a run restarted with the same
checkpoint directory resumes where it stopped and ends at the same weights as an uninterrupted
run. Held-out losses go to a JSON-lines log (no wall-clock time, so it is reproducible).

Data parallel (`setdiff.distributed`): under ``torchrun`` the model is wrapped in
DistributedDataParallel and each rank trains on its slice of the same global batch; rank 0 alone
logs and checkpoints. With ``parallel: fsdp`` the model is instead sharded in place by FSDP2:
the trajectory is the same, the EMA is kept sharded, and the exported weights and checkpoints are
full (unsharded) CPU states gathered collectively.

``compile: true`` runs the training forward through ``torch.compile`` (after DDP/FSDP); held-out
evaluation stays eager, and state dicts come from the uncompiled module (no ``_orig_mod.`` keys).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import torch

from setdiff.batching import ArraySplit
from setdiff.checkpoint import export_weights, resume_state, save_state
from setdiff.config import Bounds, Count, Count0, Device, Seed, Threads, check, frozen
from setdiff.distributed import (
    any_rank,
    gradient_sync,
    rank_and_world,
    shard,
    wrap_data_parallel,
)
from setdiff.files import write_text
from setdiff.model import Transformer
from setdiff.paradigm import Paradigm
from setdiff.progress import progress_bar
from setdiff.runtime import setup_torch

log = logging.getLogger(__name__)


@frozen
class TrainConfig:
    steps: int
    """Optimizer steps."""
    batch_size: int = 32
    """Global batch: sequences per optimizer step, over all ranks."""
    micro_batch_size: Count0 = 0
    """Sequences per forward/backward (gradient accumulation); 0 = a rank's whole share of the
    batch at once. Must divide batch_size / ranks. The step is the same either way."""
    lr: float = 3e-3
    """Peak learning rate (after warmup)."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor, as a fraction of `lr`."""
    warmup_steps: int = 50
    weight_decay: Annotated[float, Bounds(ge=0)] = 0.0
    beta1: Annotated[float, Bounds(ge=0, lt=1)] = 0.9
    beta2: Annotated[float, Bounds(ge=0, lt=1)] = 0.98
    grad_clip: float = 1.0
    """Max global grad norm; 0 disables clipping."""
    ema_decay: float = 0.0
    """EMA of weights (exported instead of the raw weights when > 0); 0 = off."""
    eval_every: int = 100
    """Steps between held-out loss evaluations (and a final one)."""
    eval_examples: Count = 256
    """Validation examples per evaluation (the first ones, fixed noise seed)."""
    checkpoint_every: int = 100
    seed: Seed = 0
    device: Device = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    """bfloat16 = autocast on CUDA (weights and optimizer stay float32)."""
    threads: Threads = 0
    """torch intra-op threads; 0 = torch's default."""
    attention: Literal["sdpa", "flex"] = "sdpa"
    """Training masks as dense tensors (SDPA) or FlexAttention block masks (block-sparse on GPU)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Multi-rank strategy: "ddp" (default) replicates the model; "fsdp" shards parameters,
    gradients and optimizer state (FSDP2) for models that do not fit one device. Only matters
    under torchrun with more than one rank."""
    compile: bool = False
    """Compile the model's training forward with torch.compile (inductor); helps on GPU for fixed
    shapes; off by default (the paper compiles OWT/CNN-DM training, not GSM8K)."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(
            self.micro_batch_size == 0 or self.batch_size % self.micro_batch_size == 0,
            f"micro_batch_size {self.micro_batch_size} must divide batch_size {self.batch_size}",
        )
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        check(
            self.warmup_steps <= self.steps,
            f"warmup_steps {self.warmup_steps} > steps {self.steps}: the learning rate would "
            "never reach lr",
        )
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
    """Weights to export (EMA when enabled). Under FSDP: full CPU tensors, on rank 0 only (other
    ranks get an empty dict; each holding a full copy is what FSDP is there to avoid)."""
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
    on_eval: Callable[[int, float], Mapping[str, float] | None] | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Train `net` with `paradigm`'s loss; resume from `checkpoint_dir` when it holds a state.

    Under FSDP `net` is sharded in place (its parameters become DTensor shards): use the
    returned weights, not `net.state_dict()`.

    Args:
        on_eval: called with (step, eval_loss) after each evaluation, with the evaluated weights
            (EMA when on) in eval mode; what it returns (e.g. an accuracy) is added to that step's
            log record. It may raise to stop the run (pruning).
        log_path: JSON-lines log of {step, train_loss, eval_loss, lr}: no wall-clock time, so
            a resumed or repeated run writes the same file (it travels with the model, which DVC
            hashes); the run's time is `TrainResult.seconds`.
    """
    device = setup_torch(config.device, threads=config.threads or None)
    rank, world = rank_and_world()
    _check_batch_split(config, world)
    sharded = world > 1 and config.parallel == "fsdp"
    model = _place(net, config, device, world, sharded)
    optimizer, scheduler = _optimizer(net, config)
    generator = torch.Generator().manual_seed(config.seed)
    ema = _ema_init(net) if config.ema_decay > 0 else None
    state_path = Path(checkpoint_dir) / "state.pt" if checkpoint_dir else None
    step = resume_state(state_path, net, optimizer, scheduler, generator, ema)
    is_main = rank == 0
    if is_main:
        _truncate_log(log_path, step)
    start_step, started, eval_loss = step, time.perf_counter(), math.nan
    train_losses: list[float] = []
    show = show_progress and is_main
    with _sigterm_as_stop() as stop_requested, _progress(config.steps, step, show) as bar:
        while step < config.steps:
            # Through the optimizer, which holds the sharded parameters: an FSDP root keeps its
            # gathered ones registered after a forward until a backward (e.g. after an eval).
            optimizer.zero_grad(set_to_none=True)
            train_loss = _step(
                model, paradigm, train_split, config, generator, device, rank, world, step
            )
            optimizer.step()
            scheduler.step()
            step += 1
            train_losses.append(train_loss)
            if ema is not None:
                _ema_update(ema, net, config.ema_decay)
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.3f}")
            if step % config.eval_every == 0 or step == config.steps:
                with _evaluated(net, ema):
                    eval_loss = evaluate_loss(net, paradigm, valid_split, config)
                    record = (step, train_loss, eval_loss, scheduler)
                    _report_eval(on_eval, record, log_path, write_log=is_main)
            # Under FSDP saving is a collective: every rank must take the same decision.
            stop = any_rank(stop_requested(), device) if sharded else stop_requested()
            due = step % config.checkpoint_every == 0 or stop
            if state_path and (is_main or sharded) and due:
                save_state(state_path, step, net, optimizer, scheduler, generator, ema)
            if stop:
                raise KeyboardInterrupt(f"SIGTERM: checkpointed at step {step}")
    if math.isnan(eval_loss):  # resumed from a checkpoint of the final step: nothing ran
        eval_loss = evaluate_loss(net, paradigm, valid_split, config, ema)
    return TrainResult(
        steps=step,
        final_train_loss=train_losses[-1] if train_losses else math.nan,
        final_eval_loss=eval_loss,
        seconds=time.perf_counter() - started,
        resumed_from=start_step,
        weights=export_weights(net, ema),
        train_losses=train_losses,
    )


def _check_batch_split(config: TrainConfig, world: int) -> None:
    """The global batch splits evenly over the ranks, and each share into micro-batches."""
    check(config.batch_size % world == 0, f"batch_size {config.batch_size} % {world} ranks != 0")
    share = config.batch_size // world
    check(
        share % (config.micro_batch_size or share) == 0,
        f"micro_batch_size {config.micro_batch_size} must divide the per-rank share {share}",
    )


def _place(
    net: Transformer, config: TrainConfig, device: torch.device, world: int, sharded: bool
) -> torch.nn.Module:
    """`net` on `device` in train mode (sharded in place under FSDP); returns the module the
    training forward runs through: DDP-wrapped with several ranks, compiled when asked."""
    if sharded:
        shard(net, device, world)
    else:
        net.to(device)
    net.train()
    model = wrap_data_parallel(net, device) if world > 1 and not sharded else net
    if config.compile:
        model = torch.compile(model)
    return model


def _optimizer(net: Transformer, config: TrainConfig) -> tuple[Any, Any]:
    """AdamW over `net`'s parameters and its warmup + cosine `LambdaLR` schedule."""
    optimizer = torch.optim.AdamW(
        net.parameters(),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_at)


def _report_eval(
    on_eval: Callable[[int, float], Mapping[str, float] | None] | None,
    record: tuple[int, float, float, Any],
    log_path: str | Path | None,
    *,
    write_log: bool,
) -> None:
    """Run `on_eval` on an evaluation's (step, train_loss, eval_loss, scheduler); then, when
    `write_log` (rank 0), log the record with its extras, even when `on_eval` raises."""
    step, train_loss, eval_loss, scheduler = record
    extra = None
    try:  # a pruning callback raises: the record is written all the same
        extra = on_eval(step, eval_loss) if on_eval is not None else None
    finally:
        if write_log:
            _log(log_path, step, train_loss, eval_loss, scheduler, extra)


def _step(
    model: torch.nn.Module,
    paradigm: Paradigm,
    split: ArraySplit,
    config: TrainConfig,
    generator: torch.Generator,
    device: torch.device,
    rank: int,
    world: int,
    step: int = 0,
) -> float:
    """Forward/backward of this rank's share of one global batch (training step `step`);
    returns the global loss.

    Every rank draws the same global batch and noise from the shared generator and keeps its own
    slice, so any number of ranks follows the single-process trajectory. The slice runs in
    micro-batches whose unnormalised objective sums are backpropagated; the summed gradients are
    then scaled by world / (global count of counted sequences), because DDP and FSDP average
    them over ranks: the result is the gradient of the global mean, whatever the split.
    Gradients accumulate: the caller zeroes them."""
    batch = split.sample(config.batch_size, generator)
    noise = paradigm.training_noise(batch, generator, progress=step / config.steps)
    share = config.batch_size // world
    micro = config.micro_batch_size or share  # divides share: checked by `train`
    total = torch.zeros((), device=device)
    n_counted = torch.zeros((), device=device, dtype=torch.long)
    starts = range(rank * share, (rank + 1) * share, micro)
    for start in starts:
        index = torch.arange(start, start + micro)
        part, part_noise = batch.select(index), {k: v[index] for k, v in noise.items()}
        with gradient_sync(model, start == starts[-1]), _autocast(config, device):
            out = paradigm.loss(model, part.to(device), noise=part_noise)
            term = (out.per_sequence * out.counted).sum()
        term.backward()
        total += term.detach().float()
        n_counted += out.counted.sum()
    if world > 1:
        torch.distributed.all_reduce(total)
        torch.distributed.all_reduce(n_counted)
    scale = world / n_counted.clamp(min=1)
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.mul_(scale)
    if config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    value = float(total / n_counted.clamp(min=1))
    if not math.isfinite(value):
        raise FloatingPointError(f"training loss is {value}; stopping")
    return value


@torch.no_grad()
def evaluate_loss(
    net: Transformer,
    paradigm: Paradigm,
    split: ArraySplit,
    config: TrainConfig,
    ema: dict[str, torch.Tensor] | None = None,
) -> float:
    """Mean per-token held-out loss on the first `eval_examples` (fixed noise seed)."""
    with _evaluated(net, ema), torch.no_grad():
        generator = torch.Generator().manual_seed(config.seed + 1)
        nll, tokens = 0.0, 0
        device = torch.device(config.device)
        for batch in split.iterate(config.batch_size, config.eval_examples):
            with _autocast(config, device):
                out = paradigm.loss(net, batch.to(device), generator)
            nll += float(out.nll_sum.sum())
            tokens += int(out.n_tokens.sum())
    return nll / max(tokens, 1)


@contextlib.contextmanager
def _evaluated(net: Transformer, ema: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """`net` in eval mode with the weights it would export (EMA when on), restored after."""
    backup = None
    if ema is not None:
        backup = {k: v.detach().clone() for k, v in net.state_dict().items()}
        net.load_state_dict(ema)
    was_training = net.training
    net.eval()
    try:
        yield
    finally:
        net.train(was_training)
        if backup is not None:
            net.load_state_dict(backup)


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


def _log(
    path: str | Path | None,
    step: int,
    train_loss: float,
    eval_loss: float,
    scheduler: Any,
    extra: Mapping[str, float] | None = None,
) -> None:
    record = {
        "step": step,
        "train_loss": train_loss,
        "eval_loss": eval_loss,
        "lr": scheduler.get_last_lr()[0],
        **(extra or {}),
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
    bar = progress_bar(total=total, initial=initial, disable=not enabled, desc="train")
    try:
        yield bar
    finally:
        bar.close()
