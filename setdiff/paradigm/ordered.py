"""One order per sequence: set diffusion (SetDLM) and any-order autoregression (AO-GPT).

Both train on ``[x0_perm ; xmasked_perm]`` under the set-causal mask (`SetLoss`); they differ in
the orders they draw: staggered first-hitting times (SetDLM) or uniform ones (AO-GPT).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from setdiff.config import check, frozen
from setdiff.masks import batched_training_mask, make_hidden_key_mask_mod, make_set_causal_mask_mod
from setdiff.orders import StaggeredSchedule, order_from_times, rank_of, sample_uniform_times
from setdiff.paradigm.base import Batch, LossOutput, Noise, _masked_nll, _Paradigm, _reduce

if TYPE_CHECKING:
    from setdiff.model import Transformer


@frozen
class SetDLMConfig:
    """Set diffusion: staggered first-hitting-time orders, set-causal two-copy training."""

    name: ClassVar[str] = "setdlm"
    set_size: int = 4
    """D, desired set size (order window s_max = 2D)."""
    max_set_size: int | None = None
    """s_max; None = 2D."""
    exponent: float | None = None
    """Survival exponent k; None = derived from D (about 1/3)."""
    ltr_share: float = 0.0
    """Share of training sequences given the left-to-right order instead of a staggered one
    (as `AOGPTConfig.ltr_share`); 0 = the paper's schedule alone."""
    shift: bool = False
    """Shifted queries, AR-compatible: the query predicting position p sits at p - 1 and reads
    the token there once it is decoded (else [MASK]); see `setdiff.masks`. A model fine-tuned
    from AR then starts as that AR model when decoded left to right. False = the paper's
    parameterization (the [MASK] query at p predicts p, no shift)."""

    def __post_init__(self) -> None:
        check(self.set_size >= 1, f"set_size (D) must be >= 1, got {self.set_size}")
        check(
            self.max_set_size is None or self.max_set_size >= self.set_size,
            f"max_set_size must be >= set_size, got {self.max_set_size} < {self.set_size}",
        )
        check(self.exponent is None or self.exponent > 0, "exponent must be > 0")
        check(0 <= self.ltr_share <= 1, f"ltr_share must be in [0, 1], got {self.ltr_share}")

    @property
    def s_max(self) -> int:
        return 2 * self.set_size if self.max_set_size is None else self.max_set_size

    def schedule(self, length: int) -> StaggeredSchedule:
        return StaggeredSchedule(
            length=length,
            set_size=min(self.set_size, length),
            max_set_size=self.max_set_size,
            exponent=self.exponent,
        )


@frozen
class AOGPTConfig:
    """Any-order autoregression, decoder-only (Xue et al. 2025, arXiv 2506.19935)."""

    name: ClassVar[str] = "aogpt"
    ltr_share: float = 0.0
    """Share of training sequences given the left-to-right order instead of a random one."""
    pad_targets: bool = False
    """Train on the padding after EOS as targets (see `MDLMConfig.pad_targets`)."""
    shift: bool = False
    """Shifted queries (as `SetDLMConfig.shift`)."""

    def __post_init__(self) -> None:
        check(0 <= self.ltr_share <= 1, f"ltr_share must be in [0, 1], got {self.ltr_share}")


class SetLoss(_Paradigm):
    """Shared machinery of set diffusion and any-order AR: one order per sequence per step.

    Input ``[x0_perm ; xmasked_perm]`` (2L) with positions ``[perm ; perm]`` under the static
    set-causal mask; logits of the masked copy predict each query's own position (no shift).
    Padding needs no mask: it is last in every order and the rule is causal in rank.
    With ``shift`` the query predicting position p is fed at p - 1 instead, with the token there
    when it comes earlier in the order (else [MASK]), under the shifted set-causal mask.
    """

    def sample_times(self, batch: Batch, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    def training_view(self, batch: Batch) -> Batch:
        """The rows as the loss sees them (AO-GPT may count padding as targets)."""
        return batch

    def sample_order(self, batch: Batch, generator: torch.Generator | None = None) -> torch.Tensor:
        batch = self.training_view(batch)
        times = self.sample_times(batch, generator).to(batch.tokens.device)
        return order_from_times(times, batch.is_context, batch.valid)

    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        return {"perm": self.sample_order(batch, generator)}  # (B, L)

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        return self.loss_for_order(model, batch, noise["perm"].to(batch.tokens.device))

    def loss_for_order(self, model: Transformer, batch: Batch, perm: torch.Tensor) -> LossOutput:
        n_tokens = batch.is_target.sum(-1)  # reported per real target token
        batch = self.training_view(batch)
        tokens = batch.tokens
        L = tokens.shape[1]
        x0 = tokens.gather(1, perm)
        targets = batch.is_target.gather(1, perm)
        if self.config.shift:
            xm, query_pos, mask = self._shifted_queries(batch, perm, targets)
        else:
            xm, query_pos = torch.where(targets, self.mask_id, x0), perm
            mask = self._mask("set_causal", make_set_causal_mask_mod(L), 2 * L, batch)
        logits = model(torch.cat((x0, xm), 1), torch.cat((perm, query_pos), 1), mask)[:, L:]
        nll = _masked_nll(logits, x0, self.mask_id)
        out = _reduce(nll, targets.float(), targets.sum(-1))
        return dataclasses.replace(out, n_tokens=n_tokens)

    def _shifted_queries(
        self, batch: Batch, perm: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Inputs, positions and mask of the shifted queries (rank order, like `perm`).

        The query of rank r predicting position p = perm[r] (a target, so p >= 1) is fed at
        p - 1 with the token there if that position's rank is below r, else [MASK]; it does not
        see the clean copy of p - 1 (its own input stands in for it)."""
        tokens = batch.tokens
        B, L = tokens.shape
        prev = (perm - 1).clamp(min=0)
        prev_rank = rank_of(perm).gather(1, prev)
        visible = prev_rank < torch.arange(L, device=tokens.device)
        prev_token = torch.where(visible, tokens.gather(1, prev), self.mask_id)
        x0 = tokens.gather(1, perm)
        inputs = torch.where(targets, prev_token, x0)
        positions = torch.where(targets, prev, perm)
        skip = torch.where(targets, prev_rank, -1)  # clean key index = rank
        skip_BQ = torch.cat((torch.full_like(skip, -1), skip), dim=1)
        mod = make_hidden_key_mask_mod(make_set_causal_mask_mod(L), skip_BQ)
        mask = batched_training_mask(mod, B, 2 * L, kind=self.attention, device=tokens.device)
        return inputs, positions, mask


class SetDLM(SetLoss):
    can_infill = True  # positions are decoded in any order: given ones may lie on both sides
    set_size_field = "set_size"

    def sample_times(self, batch: Batch, generator: torch.Generator | None) -> torch.Tensor:
        B, L = batch.tokens.shape
        times = self.config.schedule(L).sample_times(B, generator)
        if self.config.ltr_share > 0:
            ltr = torch.rand(B, generator=generator) < self.config.ltr_share
            times[ltr] = torch.linspace(1, 0, L, dtype=times.dtype)
        return times

    def decode_fixed(self) -> dict[str, Any]:
        return {"max_window": self.config.s_max, "shift": self.config.shift}


class AOGPT(SetLoss):
    can_infill = True

    def training_view(self, batch: Batch) -> Batch:
        return batch.with_padding_as_target() if self.config.pad_targets else batch

    def sample_times(self, batch: Batch, generator: torch.Generator | None) -> torch.Tensor:
        B, L = batch.tokens.shape
        return sample_uniform_times(B, L, self.config.ltr_share, generator)

    def decode_fixed(self) -> dict[str, Any]:
        return {"shift": self.config.shift}
