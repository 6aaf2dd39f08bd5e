"""When a training trial stops: the median rule on its held-out loss (`should_prune`).

Why the median rule is ours and not ``optuna.pruners.MedianPruner``: Optuna cannot prune
multi-objective studies (``Trial.should_prune`` raises; the default objectives are accuracy and
NFE); the rule compares only trials equal on ``pruning.group_by`` (a larger D has a higher loss by
design) and counts each distinct curve once (trials that reused a cached model repeat it), which
``MedianPruner`` cannot express; and the decision is taken inside the trial's subprocess against
peers fixed when the trial starts, so it does not depend on which parallel trial finishes first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


class Pruned(Exception):
    """Raised from the training callback when the median rule stops a trial."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"pruned at step {step} (held-out loss {loss:.4f})")
        self.step, self.loss = step, loss


def should_prune(
    step: int,
    loss: float,
    knobs: Mapping[str, Any],
    peers: Sequence[Mapping[str, Any]],
    *,
    min_trials: int,
    warmup_steps: int,
    group_by: Sequence[str] = (),
) -> bool:
    """The median rule for a training trial's held-out loss.

    Optuna cannot prune multi-objective trials (``Trial.should_prune`` raises), so the decision
    is this single-objective rule on the training signal, applied by the trial itself: prune at
    ``step`` when at least `min_trials` comparable completed trials logged a loss at that same
    step and `loss` is above their median (Optuna's ``MedianPruner`` rule). `peers` are the
    completed trials as ``{"knobs": {...}, "curve": [[step, loss], ...]}``, fixed when the trial
    starts, so the decision does not depend on which other trials finish first; comparable =
    equal on every knob of `group_by`; each distinct curve counts once.
    """
    if math.isnan(loss):
        return True
    if step < warmup_steps:
        return False
    # Trials that reused a cached model repeat its curve: each distinct curve counts once.
    curves = {
        tuple((int(s), float(v)) for s, v in peer["curve"])
        for peer in peers
        if all(peer["knobs"].get(k) == knobs.get(k) for k in group_by)
    }
    values = [dict(curve)[step] for curve in curves if step in dict(curve)]
    return len(values) >= min_trials and loss > statistics.median(values)
