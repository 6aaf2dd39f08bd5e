"""What every paradigm shares: the batch and loss records, the loss reductions, the base class.

`Batch` is the training/evaluation input, `LossOutput` the result of ``Paradigm.loss``;
`_Paradigm` holds the construction, the ``loss`` entry point and the capabilities callers test
instead of paradigm names (`needs_prompt`, `can_infill`, `exact_likelihood`, `set_size_field`).
The paradigms themselves live in `setdiff.paradigm.ar`, `.masked` and `.ordered`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from setdiff.masks import AttentionKind, MaskMod, training_mask

if TYPE_CHECKING:
    from setdiff.model import Transformer


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


def _masked_nll(logits: torch.Tensor, targets: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(B, T) NLL with the [MASK] logit at -inf (zero-masking parameterization)."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


Noise = dict[str, torch.Tensor]
"""A paradigm's random draws for one batch (orders, noise levels, mask draws), each (B, ...).

Drawing the noise of a whole global batch and slicing it by example is what lets a data-parallel
run follow the same trajectory as one process (`setdiff.train`)."""


class _Paradigm:
    """The base of every paradigm: its config, the [MASK] id and how training masks are built.

    Capabilities (what callers test instead of the paradigm's name):
    - `needs_prompt`: decoding needs at least one given token (e.g. BOS) before the first slot;
    - `can_infill`: the sampler decodes a span with given tokens on both sides (``suffix_ids``);
    - `exact_likelihood`: ``loss`` reports the exact NLL, not a bound (NELBO);
    - `set_size_field`: the config field holding the tokens decoded together (D or S), if any.
    """

    config: Any
    mask_id: int
    can_infill: ClassVar[bool] = False
    exact_likelihood: ClassVar[bool] = False
    set_size_field: ClassVar[str | None] = None

    def __init__(self, config: Any, mask_id: int, attention: AttentionKind = "sdpa") -> None:
        self.config, self.mask_id, self.attention = config, mask_id, attention

    @property
    def needs_prompt(self) -> bool:
        """True unless the paradigm overrides it (a masked one without shifted queries)."""
        return True

    def decode_fixed(self) -> dict[str, Any]:
        """The decode options the trained model fixes (e.g. ``shift``, ``block_size``), which
        its sampler takes beside the user's (`setdiff.sampling.policies.decode_policy`)."""
        raise NotImplementedError

    def _mask(
        self, name: str, mask_mod: MaskMod, n: int, batch: Batch, valid: torch.Tensor | None = None
    ) -> Any:
        return training_mask(
            name, mask_mod, n, valid_BK=valid, kind=self.attention, device=batch.tokens.device
        )

    def sample_noise(self, batch: Batch, generator: torch.Generator | None = None) -> Noise:
        return {}

    def training_noise(
        self, batch: Batch, generator: torch.Generator | None = None, *, progress: float = 1.0
    ) -> Noise:
        """The draws of one training step (`setdiff.train`; `progress`: the share of the
        training steps already taken, for recipes that change over training); evaluation uses
        `sample_noise`."""
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
