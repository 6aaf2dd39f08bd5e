"""Paradigms: the ONLY place AR, MDLM, BD3LM, AO-GPT and set diffusion differ.

Each paradigm is a config record plus a class with
- ``sample_noise(batch, generator) -> Noise``: its random draws (orders, noise levels, masks);
  ``training_noise`` the draws of a training step (the same, except where a recipe deviates
  from the estimator, as BD3LM's mask in every block);
- ``loss(model, batch, generator, noise=None) -> LossOutput``: its training mask and loss, all on
  the same `Transformer` backbone;
- ``decode_policy(options) -> DecodePolicy``: its sampler (see `setdiff.sampling`).

Registry: ``PARADIGMS[name] = (ConfigClass, ParadigmClass)``; `make_paradigm(name, config)`.

Losses are per-sequence means over target tokens, then a batch mean. `LossOutput` also carries
per-sequence NLL sums and token counts so evaluation can form corpus perplexities
``exp(sum nll / sum tokens)`` (exact for AR; an upper bound / NELBO for the others).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from setdiff.config import check, frozen
from setdiff.masks import (
    AttentionKind,
    MaskMod,
    batched_training_mask,
    make_block_diffusion_mask_mod,
    make_causal_mask_mod,
    make_full_mask_mod,
    make_hidden_key_mask_mod,
    make_key_padding_mask_mod,
    make_set_causal_mask_mod,
    training_mask,
)
from setdiff.orders import (
    StaggeredSchedule,
    order_from_times,
    rank_of,
    sample_uniform_times,
)

if TYPE_CHECKING:
    from setdiff.model import Transformer
    from setdiff.sampling.policies import DecodePolicy

ParadigmName = Literal["ar", "mdlm", "bd3lm", "aogpt", "setdlm"]


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """A batch of fixed-length examples: ``<bos> context target <eos> <pad>...``."""

    tokens: torch.Tensor  # (B, L) long
    context_len: torch.Tensor  # (B,) leading context tokens (bos + prompt), never a target
    length: torch.Tensor  # (B,) non-padding tokens

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.tokens.shape[1], device=self.tokens.device)

    @property
    def is_context(self) -> torch.Tensor:
        return self.positions[None] < self.context_len[:, None]  # (B, L)

    @property
    def valid(self) -> torch.Tensor:
        return self.positions[None] < self.length[:, None]  # (B, L)

    @property
    def is_target(self) -> torch.Tensor:
        return self.valid & ~self.is_context  # (B, L)

    def with_padding_as_target(self) -> Batch:
        """The same rows with their padding counted as target tokens (LLaDA's EOS padding): a
        model trained on it learns where the answer ends and fills the rest with padding."""
        full = torch.full_like(self.length, self.tokens.shape[1])
        return Batch(self.tokens, self.context_len, full)

    def select(self, index: torch.Tensor) -> Batch:
        return Batch(self.tokens[index], self.context_len[index], self.length[index])

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (self.tokens, self.context_len, self.length)))


@dataclasses.dataclass(frozen=True, slots=True)
class LossOutput:
    loss: torch.Tensor  # () mean of per_sequence over counted sequences (the objective)
    nll_sum: torch.Tensor  # (B,) summed (weighted) NLL of each sequence's targets
    n_tokens: torch.Tensor  # (B,) target tokens per sequence
    per_sequence: torch.Tensor  # (B,) each sequence's term of the objective
    counted: torch.Tensor  # (B,) bool, sequences that enter the mean (have targets/masks)

    def sum_over(self, n_counted: torch.Tensor) -> torch.Tensor:
        """Sum of this batch's terms divided by a count taken over a larger (global) batch."""
        return (self.per_sequence * self.counted).sum() / n_counted.clamp(min=1)


def _mean_counted(per_seq: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    return per_seq[counted].mean() if counted.any() else per_seq.sum() * 0


def _reduce(nll: torch.Tensor, weight: torch.Tensor, n_tokens: torch.Tensor) -> LossOutput:
    nll_sum = (nll * weight).sum(-1)
    per_seq = nll_sum / n_tokens.clamp(min=1)
    counted = n_tokens > 0
    return LossOutput(
        loss=_mean_counted(per_seq, counted),
        nll_sum=nll_sum.detach(),
        n_tokens=n_tokens,
        per_sequence=per_seq,
        counted=counted,
    )


def _reduce_masked(
    nll: torch.Tensor, masked: torch.Tensor, t: torch.Tensor, n_tokens: torch.Tensor
) -> LossOutput:
    """Masked-diffusion reduction (MDLM, BD3LM).

    Training objective: per sequence, the mean cross-entropy over its masked tokens (the
    reference recipe's low-variance surrogate of the 1/t weighting); sequences with no mask
    drawn are skipped. Reported NLL: the continuous-time NELBO, sum of CE / t over masked tokens
    (weight -alpha'/(1 - alpha) = 1/t for the linear schedule), an unbiased bound estimate.
    """
    masked_f = masked.float()
    n_masked = masked_f.sum(-1)
    per_seq = (nll * masked_f).sum(-1) / n_masked.clamp(min=1)
    counted = n_masked > 0
    nll_sum = (nll * masked_f / t).sum(-1).detach()
    return LossOutput(
        loss=_mean_counted(per_seq, counted),
        nll_sum=nll_sum,
        n_tokens=n_tokens,
        per_sequence=per_seq,
        counted=counted,
    )


def _smallest_per_block(score: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, L) bool: the position of each block's smallest score (blocks of `block_size` from 0;
    the last may be short)."""
    B, L = score.shape
    padded = F.pad(score, (0, -L % block_size), value=torch.inf).view(B, -1, block_size)
    first = F.one_hot(padded.argmin(-1), block_size).bool()
    return first.view(B, -1)[:, :L]


def _masked_nll(logits: torch.Tensor, targets: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(B, T) NLL with the [MASK] logit at -inf (zero-masking parameterization)."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


# --------------------------------------------------------------------------------------------
# Configs


@frozen
class ARConfig:
    """Autoregression: next-token cross-entropy under a causal mask."""

    name: ClassVar[str] = "ar"
    context_loss: bool = False
    """Also train on predicting the context (prompt) tokens; reported NLL stays on targets."""


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

    def __post_init__(self) -> None:
        check(0 <= self.eps < 1, f"eps must be in [0, 1), got {self.eps}")


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

    def __post_init__(self) -> None:
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(0 <= self.eps < 1, f"eps must be in [0, 1), got {self.eps}")


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
    """Shifted queries, AR-compatible: the query predicting position p sits at p - 1 and reads
    the token there once it is decoded (else [MASK]); see `setdiff.masks`. A model fine-tuned
    from AR then starts as that AR model when decoded left to right. False = the paper's
    parameterization (the [MASK] query at p predicts p, no shift)."""

    def __post_init__(self) -> None:
        check(0 <= self.ltr_share <= 1, f"ltr_share must be in [0, 1], got {self.ltr_share}")


ParadigmConfig = ARConfig | MDLMConfig | BD3LMConfig | SetDLMConfig | AOGPTConfig


# --------------------------------------------------------------------------------------------
# Paradigms

Noise = dict[str, torch.Tensor]
"""A paradigm's random draws for one batch (orders, noise levels, mask draws), each (B, ...).

Drawing the noise of a whole global batch and slicing it by example is what lets a data-parallel
run follow the same trajectory as one process (`setdiff.train`)."""


class _Paradigm:
    config: Any
    mask_id: int

    def __init__(self, config: Any, mask_id: int, attention: AttentionKind = "sdpa") -> None:
        self.config, self.mask_id, self.attention = config, mask_id, attention

    def _mask(
        self, name: str, mask_mod: MaskMod, n: int, batch: Batch, valid: torch.Tensor | None = None
    ) -> Any:
        return training_mask(
            name, mask_mod, n, valid_BK=valid, kind=self.attention, device=batch.tokens.device
        )

    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        return {}

    def training_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        """The draws of one training step (`setdiff.train`); evaluation uses `sample_noise`."""
        return self.sample_noise(batch, generator)

    def loss(
        self,
        model: Transformer,
        batch: Batch,
        generator: torch.Generator | None = None,
        *,
        noise: Noise | None = None,
    ) -> LossOutput:
        """The training objective on `batch`, drawing its noise unless `noise` is given."""
        noise = self.sample_noise(batch, generator) if noise is None else noise
        return self.loss_with_noise(model, batch, noise)

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        raise NotImplementedError


class AR(_Paradigm):
    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        tokens = batch.tokens
        L = tokens.shape[1]
        mask = self._mask("causal", make_causal_mask_mod(), L - 1, batch)
        logits = model(tokens[:, :-1], batch.positions[:-1], mask)
        targets = batch.is_target[:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), tokens[:, 1:], reduction="none")
        out = _reduce(nll, targets.float(), targets.sum(-1))
        if not self.config.context_loss:
            return out
        # The objective covers every real token after BOS; the reported NLL stays on targets.
        trained = batch.valid[:, 1:].float()
        full = _reduce(nll, trained, trained.sum(-1))
        return dataclasses.replace(full, nll_sum=out.nll_sum, n_tokens=out.n_tokens)

    def decode_policy(self, options: dict[str, Any]) -> DecodePolicy:
        from setdiff.sampling.policies import ARPolicy

        return ARPolicy.from_options(options)


class MDLM(_Paradigm):
    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        B, L = batch.tokens.shape
        # Antithetic (stratified) t over the batch lowers the variance of the NELBO estimate.
        u = torch.rand((), generator=generator).item()
        t = (u + torch.arange(B) / B) % 1.0
        t = t * (1 - self.config.eps) + self.config.eps  # (B,)
        return {"t": t, "u": torch.rand(B, L, generator=generator)}

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        n_tokens = batch.is_target.sum(-1)  # reported per real target token either way
        if self.config.pad_targets:
            batch = batch.with_padding_as_target()
        tokens, targets = batch.tokens, batch.is_target
        L = tokens.shape[1]
        t = noise["t"].to(tokens.device)
        p_mask = (1 - self.config.eps) * t
        masked = targets & (noise["u"].to(tokens.device) < p_mask[:, None])
        xt = torch.where(masked, self.mask_id, tokens)
        mask = self._mask("full", make_full_mask_mod(), L, batch, batch.valid)
        logits = model(xt, batch.positions, mask)
        if self.config.shift:  # output p - 1 predicts p (position 0, BOS, is never a target)
            logits, tokens, masked = logits[:, :-1], tokens[:, 1:], masked[:, 1:]
        nll = _masked_nll(logits, tokens, self.mask_id)
        return _reduce_masked(nll, masked, t[:, None], n_tokens)

    def decode_policy(self, options: dict[str, Any]) -> DecodePolicy:
        from setdiff.sampling.policies import MDLMPolicy

        return MDLMPolicy.from_options(options, shift=self.config.shift)


class BD3LM(_Paradigm):
    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        B, L = batch.tokens.shape
        S, eps = self.config.block_size, self.config.eps
        t_blocks = torch.rand(B, -(-L // S), generator=generator) * (1 - eps) + eps
        return {
            "t": t_blocks.repeat_interleave(S, dim=1)[:, :L],
            "u": torch.rand(B, L, generator=generator),
        }

    def training_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        noise = self.sample_noise(batch, generator)
        if self.config.mask_every_block:
            noise["mask_every_block"] = torch.ones(batch.tokens.shape[0], dtype=torch.bool)
        return noise

    def loss_with_noise(self, model: Transformer, batch: Batch, noise: Noise) -> LossOutput:
        tokens, targets = batch.tokens, batch.is_target
        L = tokens.shape[1]
        S, eps = self.config.block_size, self.config.eps
        t = noise["t"].to(tokens.device)  # (B, L): each position's block noise level
        u = noise["u"].to(tokens.device)
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

    def decode_policy(self, options: dict[str, Any]) -> DecodePolicy:
        from setdiff.sampling.policies import BlockPolicy

        return BlockPolicy.from_options(
            options, block_size=self.config.block_size, shift=self.config.shift
        )


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
    def sample_times(self, batch: Batch, generator: torch.Generator | None) -> torch.Tensor:
        B, L = batch.tokens.shape
        times = self.config.schedule(L).sample_times(B, generator)
        if self.config.ltr_share > 0:
            ltr = torch.rand(B, generator=generator) < self.config.ltr_share
            times[ltr] = torch.linspace(1, 0, L, dtype=times.dtype)
        return times

    def decode_policy(self, options: dict[str, Any]) -> DecodePolicy:
        from setdiff.sampling.policies import SetPolicy

        return SetPolicy.from_options(
            options, max_window=self.config.s_max, shift=self.config.shift
        )


class AOGPT(SetLoss):
    def training_view(self, batch: Batch) -> Batch:
        return batch.with_padding_as_target() if self.config.pad_targets else batch

    def sample_times(self, batch: Batch, generator: torch.Generator | None) -> torch.Tensor:
        B, L = batch.tokens.shape
        return sample_uniform_times(B, L, self.config.ltr_share, generator)

    def decode_policy(self, options: dict[str, Any]) -> DecodePolicy:
        from setdiff.sampling.policies import AnyOrderPolicy

        return AnyOrderPolicy.from_options(options, shift=self.config.shift)


Paradigm = AR | MDLM | BD3LM | SetDLM | AOGPT

PARADIGMS: dict[str, tuple[type, type]] = {
    "ar": (ARConfig, AR),
    "mdlm": (MDLMConfig, MDLM),
    "bd3lm": (BD3LMConfig, BD3LM),
    "aogpt": (AOGPTConfig, AOGPT),
    "setdlm": (SetDLMConfig, SetDLM),
}


def make_paradigm(
    name: str, config: Any | None = None, *, mask_id: int, attention: AttentionKind = "sdpa"
) -> Paradigm:
    """Build a paradigm by name; `config` defaults to that paradigm's default config.

    `attention` picks how training masks reach the backbone ("sdpa": dense masks; "flex": a
    FlexAttention BlockMask, for block-sparse kernels on GPU)."""
    if name not in PARADIGMS:
        raise ValueError(f"paradigm: unknown paradigm {name!r}; choose one of {list(PARADIGMS)}")
    config_cls, cls = PARADIGMS[name]
    config = config_cls() if config is None else config
    if not isinstance(config, config_cls):
        raise ValueError(
            f"paradigm {name!r} needs a {config_cls.__name__}, got {type(config).__name__}"
        )
    if attention not in ("sdpa", "flex"):
        raise ValueError(f"attention must be 'sdpa' or 'flex', got {attention!r}")
    return cls(config, mask_id, attention)
