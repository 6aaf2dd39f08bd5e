"""The lossless bench (`setdiff.bench.lossless.compare`): lossless methods are counted identical
to their reference on every prompt, AR is the unit of speed, and the drafts' acceptance is read."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from setdiff.bench.lossless import Decoded, _ours, compare
from setdiff.model import Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID, EOS = 3, 2
PROMPTS = [[1], [1, 5, 7], [1, 5, 7, 9, 11, 13, 15], [1, 4]]


class _Model:
    """A `Decodable` made of a backbone and a paradigm."""

    def __init__(self, net: Transformer, paradigm: object) -> None:
        self.net, self.paradigm, self.tokenizer = net, paradigm, None


def test_lossless_methods_equal_their_reference(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    net = make_tiny_model(seed=1, head_scale=20.0)
    ar = _Model(net, make_paradigm("ar", mask_id=MASK_ID))
    draft = _Model(make_tiny_model(seed=2, head_scale=20.0), make_paradigm("ar", mask_id=MASK_ID))
    setdlm = _Model(net, make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=MASK_ID))
    seq_len = 24
    decoders = {
        "ar": _ours(ar, seq_len, EOS),
        "ar+self k=3": _ours(ar, seq_len, EOS, draft=ar, draft_tokens=3),
        "ar+draft k=2": _ours(ar, seq_len, EOS, draft=draft, draft_tokens=2),
        "setdlm W=1": _ours(setdlm, seq_len, EOS, window=1),
        "setdlm verify W=4": _ours(setdlm, seq_len, EOS, window=4, verify=True),
        "setdlm W=4": _ours(setdlm, seq_len, EOS, window=4),
    }
    references = {
        "ar+self k=3": "ar",
        "ar+draft k=2": "ar",
        "setdlm verify W=4": "setdlm W=1",
        "setdlm W=4": "setdlm W=1",
    }
    figures = compare(
        decoders,
        references,
        PROMPTS,
        lambda tokens, i: float(i % 2),
        eos_id=EOS,
        warmup=PROMPTS[0],
        n_boot=50,
    )
    n = len(PROMPTS)
    for name in ("ar+self k=3", "ar+draft k=2", "setdlm verify W=4"):
        assert figures[name]["identical_to_reference"] == n, name
        assert figures[name]["draft_acceptance"] is not None, name
    assert figures["ar+self k=3"]["draft_acceptance"] == 1.0  # the model drafting for itself
    assert figures["ar+self k=3"]["tokens_per_forward"] > 2
    assert figures["ar"]["speedup_vs_ar"]["estimate"] == 1.0
    assert figures["ar"]["reference"] is None and figures["ar"]["draft_acceptance"] is None
    assert figures["setdlm W=4"]["identical_to_reference"] < n  # a lossy decode is counted so
    assert all(f["accuracy"] == 0.5 and f["n"] == n for f in figures.values())


def test_decoded_defaults() -> None:
    assert Decoded([1, 2], 2).drafts == (0, 0)
