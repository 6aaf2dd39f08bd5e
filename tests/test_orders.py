"""Order sampling: the staggered first-hitting-time schedule (spec 2) and uniform orders.

References are written from the spec's formulas (2.2, 2.3), not from `setdiff.orders`.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from setdiff.orders import (
    StaggeredSchedule,
    identity_order,
    order_from_times,
    rank_of,
    sample_uniform_times,
)
from setdiff.paradigm import Batch, SetDLMConfig, make_paradigm

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3


def spec_params(L: int, D: int, s_max: int | None = None) -> tuple[float, float, torch.Tensor]:
    """(b, k, loc) from spec 2.2, generic branch (1 < D < s_max)."""
    s_max = 2 * D if s_max is None else s_max
    b = s_max / (L + s_max - 1)
    A = D / (2 * L)
    k = A / (b - A)
    loc = torch.tensor([(1 - b) * (L - 1 - i) / (L - 1) for i in range(L)], dtype=torch.float64)
    return b, k, loc


def spec_survival(t: float, loc: float, b: float, k: float) -> float:
    u = (t - loc) / b
    if u <= 0:
        return 1.0
    if u >= 1:
        return 0.0
    return (1 - u) ** k


def inverse_perm(perm: torch.Tensor) -> torch.Tensor:
    """rank[b, p] for perm[b, r] = p, by explicit loops (independent of `rank_of`)."""
    rank = torch.empty_like(perm)
    for b in range(perm.shape[0]):
        for r, p in enumerate(perm[b].tolist()):
            rank[b, p] = r
    return rank


def plain_order(times: torch.Tensor) -> torch.Tensor:
    B, L = times.shape
    return order_from_times(
        times, torch.zeros(B, L, dtype=torch.bool), torch.ones(B, L, dtype=torch.bool)
    )


# ---------------------------------------------------------------------------------------------
# schedule constants


@pytest.mark.parametrize(("L", "D"), [(64, 4), (32, 4), (1024, 8), (128, 16), (20, 3), (100, 2)])
def test_width_exponent_locations_match_spec(L: int, D: int) -> None:
    s = StaggeredSchedule(length=L, set_size=D)
    b, k, loc = spec_params(L, D)
    assert s.s_max == 2 * D
    got_b, got_k = s.width_and_exponent()
    assert got_b == pytest.approx(b, rel=1e-12)
    assert got_k == pytest.approx(k, rel=1e-12)
    assert torch.allclose(s.locations(), loc, rtol=0, atol=1e-12)
    # The window of a position spans exactly s_max positions: b / (loc_i - loc_{i+1}) = s_max.
    assert b / (loc[0] - loc[1]).item() == pytest.approx(2 * D, rel=1e-9)
    # Leftmost window ends at 1, rightmost starts at 0.
    assert loc[0].item() + b == pytest.approx(1.0) and loc[-1].item() == 0.0


@pytest.mark.parametrize(
    ("L", "D", "b", "k"),
    [
        (1024, 4, 0.00776, 0.336),
        (1024, 8, 0.0154, 0.340),
        (1024, 16, 0.0303, 0.347),
        (128, 16, 0.201, 0.450),
    ],
)
def test_spec_quoted_values(L: int, D: int, b: float, k: float) -> None:
    got_b, got_k = StaggeredSchedule(length=L, set_size=D).width_and_exponent()
    assert got_b == pytest.approx(b, abs=6e-4)
    assert got_k == pytest.approx(k, abs=1e-3)


def test_explicit_exponent_and_smax() -> None:
    s = StaggeredSchedule(length=40, set_size=4, max_set_size=6, exponent=0.5)
    b, _, loc = spec_params(40, 4, s_max=6)
    assert s.s_max == 6
    assert s.width_and_exponent() == (pytest.approx(b), 0.5)
    assert torch.allclose(s.locations(), loc)


@pytest.mark.parametrize(
    "kwargs", [dict(set_size=0), dict(set_size=-2), dict(set_size=4, max_set_size=3)]
)
def test_schedule_rejects_bad_sizes(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="set_size|max_set_size"):
        StaggeredSchedule(length=16, **kwargs)


# ---------------------------------------------------------------------------------------------
# D = 1: identity


@pytest.mark.parametrize("L", [1, 2, 5, 16, 33])
def test_d1_gives_only_identity(L: int) -> None:
    s = StaggeredSchedule(length=L, set_size=1)
    g = torch.Generator().manual_seed(0)
    times = s.sample_times(200, generator=g)
    perm = plain_order(times)
    assert torch.equal(perm, torch.arange(L).expand(200, L))


def test_d1_paradigm_order_is_identity_with_context_and_padding() -> None:
    p = make_paradigm("setdlm", SetDLMConfig(set_size=1), mask_id=MASK_ID)
    L = 12
    batch = Batch(
        tokens=torch.randint(4, 24, (4, L)),
        context_len=torch.tensor([1, 3, 5, 1]),
        length=torch.tensor([12, 9, 12, 6]),
    )
    for seed in range(20):
        perm = p.sample_order(batch, torch.Generator().manual_seed(seed))
        assert torch.equal(perm, torch.arange(L).expand(4, L))


def test_d1_survival_is_a_step() -> None:
    L = 10
    s = StaggeredSchedule(length=L, set_size=1)
    # grid avoiding the exact step points T_i = (2(L - 1 - i) + 1) / (2L)
    t = (torch.arange(500, dtype=torch.float64) + 0.5) / 500
    a = s.survival(t)
    assert set(a.unique().tolist()) == {0.0, 1.0}
    times = s.sample_times(1)[0]
    # P(T_i <= t) = 1 - alpha_i(t) with a deterministic T_i.
    assert torch.equal((times[None, :] <= t[:, None]).double(), 1 - a)


# ---------------------------------------------------------------------------------------------
# the order window is exactly s_max positions


@pytest.mark.parametrize(("L", "D", "s_max"), [(32, 4, None), (24, 2, None), (40, 4, 6)])
def test_order_window_is_exactly_smax(L: int, D: int, s_max: int | None) -> None:
    s = StaggeredSchedule(length=L, set_size=D, max_set_size=s_max)
    window = s.s_max
    g = torch.Generator().manual_seed(1)
    times = s.sample_times(4000, generator=g)
    rank = torch.argsort(plain_order(times), dim=1)  # inverse permutation
    swapped_at = set()
    for d in range(1, L):
        # pair (i, i + d) is swapped when i is revealed after i + d
        if (rank[:, :-d] > rank[:, d:]).any():
            swapped_at.add(d)
    assert max(swapped_at) == window - 1, sorted(swapped_at)
    assert all(d < window for d in swapped_at)
    # The same straight from the times (larger T = revealed first).
    for d in range(window, L):
        assert (times[:, :-d] > times[:, d:]).all()


def test_first_hitting_times_lie_in_windows() -> None:
    L, D = 48, 4
    s = StaggeredSchedule(length=L, set_size=D)
    b, _, loc = spec_params(L, D)
    times = s.sample_times(2000, generator=torch.Generator().manual_seed(2))
    assert times.dtype == torch.float64
    assert (times >= loc - 1e-12).all() and (times <= loc + b + 1e-12).all()


def test_sample_times_is_seeded() -> None:
    s = StaggeredSchedule(length=20, set_size=4)
    a = s.sample_times(5, generator=torch.Generator().manual_seed(7))
    b = s.sample_times(5, generator=torch.Generator().manual_seed(7))
    c = s.sample_times(5, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------------------------------------
# inference budget: E[# masked and in transition] = D / 2


@pytest.mark.parametrize(("L", "D"), [(64, 4), (64, 8)])
def test_mean_masked_in_transition_is_half_d(L: int, D: int) -> None:
    s = StaggeredSchedule(length=L, set_size=D)
    b, _, loc = spec_params(L, D)
    g = torch.Generator().manual_seed(3)
    n = 40000
    times = s.sample_times(n, generator=g)
    t = torch.rand(n, 1, dtype=torch.float64, generator=g)
    masked = times <= t  # spec 2.2: P(T_i <= t) = 1 - alpha_i(t) = P(masked at t)
    in_transition = (loc < t) & (t < loc + b)
    mean = (masked & in_transition).sum(1).double().mean().item()
    assert mean == pytest.approx(D / 2, rel=0.05)


# ---------------------------------------------------------------------------------------------
# D = L: uniform orders


def _chi_square(counts: list[int]) -> float:
    n = sum(counts)
    e = n / len(counts)
    return sum((c - e) ** 2 / e for c in counts)


@pytest.mark.parametrize("source", ["staggered", "uniform"])
def test_d_equals_l_gives_uniform_orders(source: str) -> None:
    L, n = 4, 24000
    g = torch.Generator().manual_seed(4)
    if source == "staggered":
        s = make_paradigm("setdlm", SetDLMConfig(set_size=L), mask_id=MASK_ID).config.schedule(L)
        assert s.width_and_exponent() == (1.0, 1.0)
        assert torch.equal(s.locations(), torch.zeros(L, dtype=torch.float64))
        times = s.sample_times(n, generator=g)
    else:
        times = sample_uniform_times(n, L, generator=g)
    perm = plain_order(times)
    counts = {p: 0 for p in itertools.permutations(range(L))}
    for row in perm.tolist():
        counts[tuple(row)] += 1
    assert min(counts.values()) > 0  # all 4! orders appear
    # chi-square with 23 dof: P(chi2 > 60) ~ 4e-5; fixed seed keeps it deterministic.
    assert _chi_square(list(counts.values())) < 60


def test_d_equals_l_first_revealed_position_uniform() -> None:
    L, n = 10, 20000
    s = StaggeredSchedule(length=L, set_size=L)
    perm = plain_order(s.sample_times(n, generator=torch.Generator().manual_seed(5)))
    first = torch.bincount(perm[:, 0], minlength=L).tolist()
    last = torch.bincount(perm[:, -1], minlength=L).tolist()
    # 9 dof: P(chi2 > 33) ~ 1e-4
    assert _chi_square(first) < 33 and _chi_square(last) < 33


def test_staggered_orders_are_not_uniform() -> None:
    """Contrast: with D = 2 and L = 16 the first revealed position is almost always near 0."""
    s = StaggeredSchedule(length=16, set_size=2)
    perm = plain_order(s.sample_times(2000, generator=torch.Generator().manual_seed(6)))
    assert (perm[:, 0] < 4).all()


def test_uniform_times_ltr_share() -> None:
    L = 6
    g = torch.Generator().manual_seed(9)
    ltr = plain_order(sample_uniform_times(50, L, ltr_share=1.0, generator=g))
    assert torch.equal(ltr, torch.arange(L).expand(50, L))
    half = plain_order(sample_uniform_times(4000, L, ltr_share=0.5, generator=g))
    share = (half == torch.arange(L)).all(1).double().mean().item()
    assert share == pytest.approx(0.5 + 0.5 / math.factorial(L), abs=0.04)


# ---------------------------------------------------------------------------------------------
# context prefix first, padding suffix last


@pytest.mark.parametrize("source", ["staggered", "uniform"])
def test_context_first_padding_last(source: str) -> None:
    L, B = 16, 64
    g = torch.Generator().manual_seed(10)
    if source == "staggered":
        times = StaggeredSchedule(length=L, set_size=4).sample_times(B, generator=g)
    else:
        times = sample_uniform_times(B, L, generator=g)
    ctx = torch.randint(0, 8, (B,), generator=g)
    length = torch.randint(8, L + 1, (B,), generator=g)
    pos = torch.arange(L)
    is_context = pos[None] < ctx[:, None]
    valid = pos[None] < length[:, None]
    perm = order_from_times(times, is_context, valid)
    assert perm.dtype == torch.long
    for b in range(B):
        c, n = int(ctx[b]), int(length[b])
        row = perm[b].tolist()
        assert row[:c] == list(range(c))
        assert row[n:] == list(range(n, L))
        assert sorted(row[c:n]) == list(range(c, n))
        # targets are ordered by decreasing time
        t = times[b, row[c:n]]
        assert (t[:-1] >= t[1:]).all()


def test_rank_of_and_identity_order() -> None:
    g = torch.Generator().manual_seed(11)
    perm = plain_order(sample_uniform_times(8, 9, generator=g))
    assert torch.equal(rank_of(perm), inverse_perm(perm))
    assert torch.equal(identity_order(3, 5), torch.arange(5).expand(3, 5))


# ---------------------------------------------------------------------------------------------
# survival alpha_i(t)


@pytest.mark.parametrize(("L", "D"), [(16, 4), (64, 4), (9, 2)])
def test_survival_matches_formula_and_is_monotone(L: int, D: int) -> None:
    s = StaggeredSchedule(length=L, set_size=D)
    b, k, loc = spec_params(L, D)
    t = torch.linspace(0, 1, 201, dtype=torch.float64)
    a = s.survival(t)
    assert a.shape == (201, L)
    ref = torch.tensor([[spec_survival(tt, float(li), b, k) for li in loc] for tt in t.tolist()])
    assert torch.allclose(a, ref.double(), atol=1e-9)
    assert (a[1:] <= a[:-1] + 1e-12).all()  # non-increasing in t
    assert torch.equal(a[0], torch.ones(L, dtype=torch.float64))  # everything clean at t = 0
    # Everything masked at t = 1 (position 0's window ends exactly at 1: tiny rounding allowed).
    assert (a[-1] <= 1e-4).all()
    # Position i + 1 has a smaller loc: it is masked no later (forward time) than position i.
    assert (a[:, 1:] <= a[:, :-1] + 1e-12).all()


@pytest.mark.parametrize(("L", "D"), [(16, 4), (12, 3)])
def test_empirical_hitting_cdf_matches_survival(L: int, D: int) -> None:
    s = StaggeredSchedule(length=L, set_size=D)
    times = s.sample_times(20000, generator=torch.Generator().manual_seed(12))
    t = torch.linspace(0, 1, 41, dtype=torch.float64)
    empirical = (times[None, :, :] <= t[:, None, None]).double().mean(1)  # (41, L)
    assert torch.allclose(empirical, 1 - s.survival(t), atol=0.015)
