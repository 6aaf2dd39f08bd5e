"""Autoregression: next-token cross-entropy under a causal mask, decoded one token per step."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch.nn.functional as F

from setdiff.config import frozen
from setdiff.masks import make_causal_mask_mod
from setdiff.paradigm.base import Batch, LossOutput, Noise, _Paradigm, _reduce

if TYPE_CHECKING:
    from setdiff.model import Transformer


@frozen
class ARConfig:
    """Autoregression: next-token cross-entropy under a causal mask."""

    name: ClassVar[str] = "ar"
    context_loss: bool = False
    """Also train on predicting the context (prompt) tokens; reported NLL stays on targets."""


class AR(_Paradigm):
    exact_likelihood = True  # the chain rule in one fixed order: the NLL itself, not a bound

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

    def decode_fixed(self) -> dict[str, Any]:
        return {}
