"""Token orderings: the staggered first-hitting-time schedule, uniform orders, and helpers.

An order is a permutation `perm` (B, L) of positions: ``perm[b, r]`` is the position revealed
r-th. Context (a prefix) is always first and keeps its order; padding (a suffix) is always last;
only target positions are permuted.

Staggered schedule (set diffusion, Arriola & Kuleshov 2026, arXiv 2607.01775), with desired set
size D, window s_max (default 2D) and length L:
    b = s_max / (L + s_max - 1)          width of each position's time window
    A = D / (2L),  k = A / (b - A)       survival exponent
    loc_i = (1 - b) (L - 1 - i) / (L - 1)
    alpha_i(t) = (1 - (t - loc_i) / b)^k inside the window, 1 before, 0 after
A position's first-hitting time is ``T_i = loc_i + b (1 - U^{1/k})``, U ~ Unif(0, 1); the order
sorts T descending (largest T is revealed first). Positions s_max or more apart are always
left-to-right; the expected number of masked in-transition tokens is D / 2.
D = 1 is the identity order (AR); D = s_max = L gives uniform orders (any-order AR / MDLM).
"""

from __future__ import annotations

import math

import torch

from setdiff.config import check, frozen


@frozen
class StaggeredSchedule:
    """Per-position survival windows for sequences of `length` L."""

    length: int
    set_size: int
    """D, the desired (average) set size."""
    max_set_size: int | None = None
    """s_max, the order window in positions; None = 2D (as the paper trains), capped at L."""
    exponent: float | None = None
    """Survival exponent k; None derives it from D (about 1/3)."""

    def __post_init__(self) -> None:
        check(self.length >= 1, f"length must be >= 1, got {self.length}")
        check(self.set_size >= 1, f"set_size (D) must be >= 1, got {self.set_size}")
        check(self.s_max >= self.set_size, f"max_set_size {self.s_max} < set_size {self.set_size}")
        check(self.exponent is None or self.exponent > 0, "exponent must be > 0")

    @property
    def s_max(self) -> int:
        s_max = 2 * self.set_size if self.max_set_size is None else self.max_set_size
        return min(s_max, self.length)

    @property
    def is_step(self) -> bool:
        """D = 1: the survival is a hard step and the order is the identity."""
        return self.set_size == 1

    def width_and_exponent(self) -> tuple[float, float]:
        """(b, k) as in the module docstring, with the D = 1 and D = s_max special cases."""
        area = self.set_size / (2 * self.length)
        if self.is_step or self.set_size >= self.s_max:
            b, k = 2 * area, 1.0
        else:
            b = self.s_max / (self.length + self.s_max - 1)
            k = area / (b - area)
        return b, (self.exponent if self.exponent is not None else k)

    def locations(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(L,) start of each position's time window."""
        b, _ = self.width_and_exponent()
        i = torch.arange(self.length, device=device, dtype=torch.float64)
        denom = max(self.length - 1, 1)
        return (1 - b) * (self.length - 1 - i) / denom

    def survival(self, t: torch.Tensor) -> torch.Tensor:
        """alpha_i(t): (..., L) probability that each position is still clean at time t."""
        b, k = self.width_and_exponent()
        u = ((t[..., None] - self.locations(t.device)) / b).clamp(0, 1)
        if self.is_step:
            return (u < 0.5).double()
        return (1 - u) ** k

    def sample_times(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, L) first-hitting times, float64."""
        b, k = self.width_and_exponent()
        loc = self.locations()
        if self.is_step:
            return (loc + b / 2).expand(batch, -1).clone()
        exp = torch.empty(batch, self.length, dtype=torch.float64).exponential_(generator=generator)
        # 1 - U^(1/k) with U = exp(-E): -expm1(-E/k) stays accurate for small k.
        return loc + b * -torch.expm1(-exp / k)


def order_from_times(
    times: torch.Tensor, is_context: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Sort first-hitting times into an order, pinning context first and padding last.

    Args:
        times: (B, L) first-hitting times (larger = revealed earlier).
        is_context: (B, L) bool, a prefix of each row.
        valid: (B, L) bool, False on the padding suffix.
    Returns:
        (B, L) long permutation, ``perm[b, r]`` = position revealed r-th.
    """
    times = times.to(torch.float64).clone()
    times[is_context] = math.inf
    times[~valid] = -math.inf
    # Stable sort on -times keeps context (all +inf) and padding (all -inf) in position order.
    return torch.sort(-times, dim=-1, stable=True).indices


def sample_uniform_times(
    batch: int, length: int, ltr_share: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B, L) times giving uniformly random orders; a `ltr_share` of rows is left-to-right."""
    times = torch.rand(batch, length, dtype=torch.float64, generator=generator)
    if ltr_share > 0:
        ltr = torch.rand(batch, generator=generator) < ltr_share
        ltr_times = torch.linspace(1, 0, length, dtype=torch.float64)
        times[ltr] = ltr_times
    return times


def identity_order(batch: int, length: int) -> torch.Tensor:
    return torch.arange(length).expand(batch, -1).clone()


def rank_of(perm: torch.Tensor) -> torch.Tensor:
    """Inverse permutation: ``rank[b, p]`` = rank at which position p is revealed."""
    rank = torch.empty_like(perm)
    rank.scatter_(-1, perm, torch.arange(perm.shape[-1], device=perm.device).expand_as(perm))
    return rank
