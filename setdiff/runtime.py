"""Process-level torch set-up: the device a run computes on, its intra-op thread count and its
global seed, in one call that every entry point makes before building models.

`setup_torch` mutates only what it is asked to (``threads`` / ``seed`` None leave torch's
setting as it is), and nothing in `setdiff` mutates these at import time (style 3.11). The
seed here is torch's global one (model initialisation); samplers and training draw from
explicit `torch.Generator`s and do not depend on it.
"""

from __future__ import annotations

import os
import platform

import torch

from setdiff.config import check


def setup_torch(
    device: str | torch.device = "cpu", *, threads: int | None = None, seed: int | None = None
) -> torch.device:
    """Set torch's intra-op threads and global seed; return `device` as a `torch.device`.

    Args:
        device: where the run computes ("cpu", "cuda", "cuda:1", ...); parsed, not moved to.
        threads: `torch.set_num_threads`; None keeps torch's current setting.
        seed: `torch.manual_seed` (CPU and every CUDA device); None leaves the RNG as it is.

    Raises:
        ValueError: `threads` is below 1.
    """
    if threads is not None:
        check(threads >= 1, f"threads must be >= 1 (None keeps torch's setting), got {threads}")
        torch.set_num_threads(threads)
    if seed is not None:
        torch.manual_seed(seed)
    return torch.device(device)


def unavailable(device: str) -> str | None:
    """Why this machine cannot compute on `device` (a `setdiff.config.Device`), else None."""
    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            return f"{device!r} is not available here (torch.cuda.is_available() is False)"
        if index and int(index) >= torch.cuda.device_count():
            return f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    if kind == "mps" and not torch.backends.mps.is_available():
        return f"{device!r} is not available here (torch.backends.mps.is_available() is False)"
    return None


def host() -> dict[str, object]:
    """What decides a CPU run's floating-point results besides the code and the seed: the CPU
    model and core count, and the instruction set torch dispatches its kernels to
    (``cpu_capability``: AVX2, AVX512, ...). Two hosts that differ here can train different
    weights from the same inputs (one host, and its thread count, reproduces them bit for bit)."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; elsewhere `platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
