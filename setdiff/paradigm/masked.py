"""Masked diffusion: MDLM (one noise level per sequence) and BD3LM (one per block).

Both mask target tokens independently at a drawn level t and train the [MASK] queries to predict
them; their reported NLL is the continuous-time NELBO (`_reduce_masked`), a bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from setdiff.config import check, frozen
from setdiff.masks import (
    MaskMod,
    batched_training_mask,
    make_block_diffusion_mask_mod,
    make_full_mask_mod,
    make_hidden_key_mask_mod,
    make_key_padding_mask_mod,
    make_prompt_causal_mask_mod,
)
from setdiff.paradigm.base import Batch, LossOutput, Noise, _masked_nll, _Paradigm, _reduce_masked

if TYPE_CHECKING:
    from setdiff.model import Transformer


@frozen
class MDLMConfig:
    """Masked diffusion (Sahoo et al. 2024): log-linear schedule, one t per sequence."""

    name: ClassVar[str] = "mdlm"
    eps: float = 1e-3
    """Noise floor: a token is masked with probability (1 - eps) t."""
    pad_targets: bool = False
    """Train on the padding after EOS as targets (LLaDA), so the decoder learns the answer's
    length from a fixed canvas; False = padding is hidden and never predicted."""
    shift: bool = False
    """Dream's shift, AR-compatible: the output at position p - 1 predicts position p (the
    canvas keeps [MASK] where a token is unknown); False = each position predicts itself."""
    causal_prompt: bool = False
    """The prompt (BOS and context) attends causally, as AR computes it; the answer canvas stays
    bidirectional and sees the whole prompt. False = MDLM's full bidirectional attention."""
    ltr_share: float = 0.0
    """Share of training sequences masked as left-to-right decoding leaves them (a suffix of
    the answer and all padding masked; `_suffix_draws`) instead of independently; the analog
    of `SetDLMConfig.ltr_share`. 0 = MDLM's independent masks alone."""

    anneal: float = 0.0
    """Attention annealing (DiffuLLaMA, Gong et al. 2024): over this share of the training
    steps the answer canvas opens from causal to bidirectional, each canvas query seeing each
    later canvas key with a probability rising linearly from 0 to 1 (needs `causal_prompt`).
    0 = bidirectional from the first step; evaluation always uses the bidirectional canvas."""

    def __post_init__(self) -> None:
        check(0 <= self.eps < 1, f"eps must be in [0, 1), got {self.eps}")
        check(0 <= self.ltr_share <= 1, f"ltr_share must be in [0, 1], got {self.ltr_share}")
        check(0 <= self.anneal <= 1, f"anneal must be in [0, 1], got {self.anneal}")
        check(
            self.anneal == 0 or self.causal_prompt,
            "anneal needs causal_prompt: true (it opens the canvas after the causal prompt)",
        )


@frozen
class BD3LMConfig:
    """Block diffusion (Arriola et al. 2025): blocks of `block_size`, one t per block."""

    name: ClassVar[str] = "bd3lm"
    block_size: int = 4
    """S, tokens per block."""
    eps: float = 1e-3
    mask_every_block: bool = True
    """Training masks at least one target of every block (the reference recipe: a block drawn
    without a mask teaches nothing). Evaluation keeps the plain draw, an unbiased NELBO."""
    shift: bool = False
    """Shifted queries (see `SetDLMConfig.shift`): the noisy block is fed one position to the
    left, its first query holding the previous block's last token; S = 1 is then AR."""
    ltr_share: float = 0.0
    """Share of training sequences whose blocks are masked as left-to-right decoding within a
    block leaves them (a suffix of each block; `_suffix_draws`); 0 = independent masks alone."""

    def __post_init__(self) -> None:
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(0 <= self.eps < 1, f"eps must be in [0, 1), got {self.eps}")
        check(0 <= self.ltr_share <= 1, f"ltr_share must be in [0, 1], got {self.ltr_share}")


def _smallest_per_block(score: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, L) bool: the position of each block's smallest score (blocks of `block_size` from 0;
    the last may be short)."""
    B, L = score.shape
    padded = F.pad(score, (0, -L % block_size), value=torch.inf).view(B, -1, block_size)
    first = F.one_hot(padded.argmin(-1), block_size).bool()
    return first.view(B, -1)[:, :L]


def _suffix_draws(targets: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, L) draws u that mask each block's targets right to left as the level rises: the k-th
    target from a block's end (of n) draws (k - 1/2) / n, so ``u < p`` masks its last
    round(p n) targets, the state left-to-right decoding leaves; non-targets draw inf."""
    B, L = targets.shape
    t = F.pad(targets.float(), (0, -L % block_size)).view(B, -1, block_size)
    from_end = t.flip(-1).cumsum(-1).flip(-1)  # targets at or after each position, per block
    u = (from_end - 0.5) / t.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(targets, u.view(B, -1)[:, :L], torch.inf)


def _draw_ltr(n: int, share: float, generator: torch.Generator | None) -> torch.Tensor:
    """(n,) bool: the training rows masked left to right (a `share` of them)."""
    return torch.rand(n, generator=generator) < share


class MDLM(_Paradigm):
    can_infill = True  # the whole canvas is bidirectional: a suffix is just more given tokens

    @property
    def needs_prompt(self) -> bool:
        return bool(self.config.shift)  # the output at p - 1 predicts p: p - 1 must exist

    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        B, L = batch.tokens.shape
        # Antithetic (stratified) t over the batch lowers the variance of the NELBO estimate.
        u = torch.rand((), generator=generator).item()
        t = (u + torch.arange(B) / B) % 1.0
        t = t * (1 - self.config.eps) + self.config.eps  # (B,)
        return {"t": t, "u": torch.rand(B, L, generator=generator)}

    def training_noise(
        self, batch: Batch, generator: torch.Generator | None = None, *, progress: float = 1.0
    ) -> Noise:
        noise = self.sample_noise(batch, generator)
        if self.config.ltr_share > 0:
            noise["ltr"] = _draw_ltr(batch.tokens.shape[0], self.config.ltr_share, generator)
        opened = progress / self.config.anneal if self.config.anneal > 0 else 1.0
        if opened < 1:  # each later canvas key visible with probability `opened`
            B, L = batch.tokens.shape
            noise["open"] = torch.rand(B, L, L, generator=generator) < opened
        return noise

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        answer = batch.is_target
        n_tokens = answer.sum(-1)  # reported per real target token either way
        if self.config.pad_targets:
            batch = batch.with_padding_as_target()
        tokens, targets = batch.tokens, batch.is_target
        L = tokens.shape[1]
        t = noise["t"].to(tokens.device)
        p_mask = (1 - self.config.eps) * t
        u = noise["u"].to(tokens.device)
        if "ltr" in noise:  # the answer's suffix and all padding after it
            ltr = torch.where(answer, _suffix_draws(answer, L), 0.0)
            u = torch.where(noise["ltr"].to(tokens.device)[:, None], ltr, u)
        masked = targets & (u < p_mask[:, None])
        xt = torch.where(masked, self.mask_id, tokens)
        if self.config.causal_prompt:
            opened = noise["open"].to(tokens.device) if "open" in noise else None
            mod = make_key_padding_mask_mod(
                make_prompt_causal_mask_mod(batch.context_len.to(tokens.device), opened),
                batch.valid,
            )
            mask = batched_training_mask(
                mod, tokens.shape[0], L, kind=self.attention, device=tokens.device
            )
        else:
            mask = self._mask("full", make_full_mask_mod(), L, batch, batch.valid)
        logits = model(xt, batch.positions, mask)
        if self.config.shift:  # output p - 1 predicts p (position 0, BOS, is never a target)
            logits, tokens, masked = logits[:, :-1], tokens[:, 1:], masked[:, 1:]
        nll = _masked_nll(logits, tokens, self.mask_id)
        return _reduce_masked(nll, masked, t[:, None], n_tokens)

    def decode_fixed(self) -> dict[str, Any]:
        return {"shift": self.config.shift, "causal_prompt": self.config.causal_prompt}


class BD3LM(_Paradigm):
    set_size_field = "block_size"

    @property
    def needs_prompt(self) -> bool:
        return bool(self.config.shift)  # a shifted block reads the token before it

    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        B, L = batch.tokens.shape
        S, eps = self.config.block_size, self.config.eps
        t_blocks = torch.rand(B, -(-L // S), generator=generator) * (1 - eps) + eps
        return {
            "t": t_blocks.repeat_interleave(S, dim=1)[:, :L],
            "u": torch.rand(B, L, generator=generator),
        }

    def training_noise(
        self, batch: Batch, generator: torch.Generator | None = None, *, progress: float = 1.0
    ) -> Noise:
        noise = self.sample_noise(batch, generator)
        if self.config.mask_every_block:
            noise["mask_every_block"] = torch.ones(batch.tokens.shape[0], dtype=torch.bool)
        if self.config.ltr_share > 0:
            noise["ltr"] = _draw_ltr(batch.tokens.shape[0], self.config.ltr_share, generator)
        return noise

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        tokens, targets = batch.tokens, batch.is_target
        L = tokens.shape[1]
        S, eps = self.config.block_size, self.config.eps
        t = noise["t"].to(tokens.device)  # (B, L): each position's block noise level
        u = noise["u"].to(tokens.device)
        if "ltr" in noise:  # a suffix of each block
            u = torch.where(noise["ltr"].to(tokens.device)[:, None], _suffix_draws(targets, S), u)
        masked = targets & (u < (1 - eps) * t)
        if "mask_every_block" in noise:
            # The target with the smallest draw in each block is masked: a no-op for blocks that
            # drew a mask (that target is among them), one mask for those that drew none.
            forced = _smallest_per_block(torch.where(targets, u, torch.inf), S) & targets
            masked |= forced & noise["mask_every_block"].to(tokens.device)[:, None]
        xt = torch.where(masked, self.mask_id, tokens)
        valid2 = torch.cat((batch.valid, batch.valid), dim=1)
        mask_mod = make_block_diffusion_mask_mod(L, S)
        positions = torch.cat((batch.positions, batch.positions))
        if self.config.shift:
            xt, positions, mask = self._shifted(batch, tokens, xt, mask_mod, valid2)
        else:
            mask = self._mask(f"block{S}", mask_mod, 2 * L, batch, valid2)
        logits = model(torch.cat((tokens, xt), dim=1), positions, mask)[:, L:]
        nll = _masked_nll(logits, tokens, self.mask_id)
        return _reduce_masked(nll, masked, t, targets.sum(-1))

    def _shifted(
        self,
        batch: Batch,
        tokens: torch.Tensor,
        xt: torch.Tensor,
        mask_mod: MaskMod,
        valid2: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The noisy copy fed one position left: the query of p holds position p - 1's token
        (noisy within the block, clean from the previous block) and does not see the clean
        copy of p - 1 when that is the previous block's last token."""
        B, L = tokens.shape
        S, device = self.config.block_size, tokens.device
        pos = batch.positions
        prev = (pos - 1).clamp(min=0)
        same_block = (prev // S) == (pos // S)
        inputs = torch.where(same_block, xt[:, prev], tokens[:, prev])
        hidden = torch.where(same_block | (pos == 0), -1, prev)
        hidden_BQ = torch.cat((torch.full_like(hidden, -1), hidden)).expand(B, -1)
        mod = make_key_padding_mask_mod(make_hidden_key_mask_mod(mask_mod, hidden_BQ), valid2)
        mask = batched_training_mask(mod, B, 2 * L, kind=self.attention, device=device)
        return inputs, torch.cat((pos, prev)), mask

    def decode_fixed(self) -> dict[str, Any]:
        return {"block_size": self.config.block_size, "shift": self.config.shift}
