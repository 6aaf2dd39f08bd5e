"""setdiff.arguments: the checks of user-given values refuse bools, non-finite numbers and lone
strings, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from setdiff.arguments import as_int, as_sequence, is_int, is_number, per_row


def test_is_int_and_is_number_refuse_bools() -> None:
    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(3.0)
    assert is_number(0.5) and is_number(2) and not is_number(False)
    assert not is_number(float("nan")) and not is_number(float("inf")) and not is_number("1")


def test_as_int_takes_integers_of_any_kind() -> None:
    assert as_int(np.int32(4), "n") == 4 and as_int(torch.tensor(5), "n") == 5
    for bad in (True, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"^seed must be an integer, got"):
            as_int(bad, "seed")


def test_as_sequence_refuses_a_lone_string_or_number() -> None:
    assert as_sequence((1, 2), "ids", "token ids") == [1, 2]
    assert as_sequence(range(2), "ids", "token ids") == [0, 1]
    for bad in ("ab", b"ab", 3):
        with pytest.raises(ValueError, match=r"^ids must be a list of token ids"):
            as_sequence(bad, "ids", "token ids")


def test_per_row_broadcasts_one_int_or_checks_one_per_row() -> None:
    assert per_row(7, 3, "seed") == [7, 7, 7]
    assert per_row([1, 2, 3], 3, "seed") == [1, 2, 3]
    with pytest.raises(ValueError, match=r"hold one per prompt \(3\), got 2"):
        per_row([1, 2], 3, "seed")
    with pytest.raises(ValueError, match=r"^seed\[1\] must be an integer"):
        per_row([1, 2.5, 3], 3, "seed")
