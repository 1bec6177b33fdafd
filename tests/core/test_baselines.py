"""Tests of the Section 8 baselines: BaseCC, PartitionCC, GaussianCC, LaplaceTree.

Statistical tests use fixed seeds; each states its false-alarm rate and runs a control
with a deliberately wrong constant that the same check rejects.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from processor.core.baselines import (
    BaseCC,
    GaussianCC,
    LaplaceTree,
    PartitionCC,
    gaussiancc_a,
    gaussiancc_sigma,
    laplace_tree_sigma_units,
    partitioncc_parameters,
)
from processor.core.calibration import gdp_delta, gdp_mu
from processor.core.cc import UnboundedCC
from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from tests.core.test_counters import (
    failure_count_limit,
    normal_fit_rejects,
    unit_variance_rejects,
)

EPS, DELTA = 1.0, 1e-5
KEY = NoiseKey.from_seed(11)


def bern(n: int, p: float, seed: int) -> list[float | None]:
    rng = np.random.default_rng(seed)
    return [1.0 if v else None for v in rng.random(n) < p]


def test_gaussiancc_sequence_is_square_summable_below_one() -> None:
    """sum_t a_t^2 <= 1 (needed for mu-GDP): partial sum to 10^6 plus the integral tail
    bound sum_{t > N} 1/(1.85^2 t ln^2(t+1)) <= 1/(1.85^2 ln N)."""
    n = 10**6
    t = np.arange(1, n + 1, dtype=np.float64)
    partial = float(np.sum(1.0 / (1.85**2 * t * np.log(t + 1) ** 2)))
    assert partial + 1.0 / (1.85**2 * math.log(n)) <= 1.0
    assert gaussiancc_a(3) == pytest.approx(1 / (1.85 * math.sqrt(3) * math.log(4)))


def test_gaussiancc_sigma_is_one_over_mu_a_t() -> None:
    mu = gdp_mu(EPS, DELTA)
    assert gdp_delta(mu, EPS) <= DELTA
    for t in (1, 2, 10, 1000, 10**6):
        want = 1.85 * math.sqrt(t) * math.log(t + 1) / mu
        assert gaussiancc_sigma(EPS, DELTA, t) == pytest.approx(want, rel=1e-9)
        assert gaussiancc_sigma(EPS, DELTA, t) >= want  # rounded up, never less noise


def test_gaussiancc_variance_matches() -> None:
    """(y_t - s_t) / sigma_t of 1500 independent GaussianCC runs at t = 5 is N(0, 1), with
    sigma_t = 1/(mu a_t). False-alarm rate 1e-3. Control: a_t with 1.6 in place of 1.85
    (too little noise, not private) is rejected."""
    t = 5
    z = np.empty(1500)
    for i in range(1500):
        c = GaussianCC(EPS, DELTA, KEY, f"g{i}")
        s = 0.0
        for x in bern(t, 0.5, i):
            c.update(x)
            s += x or 0.0
        z[i] = (c.y - s) / gaussiancc_sigma(EPS, DELTA, t)
    assert not normal_fit_rejects(z)
    assert normal_fit_rejects(z * 1.85 / 1.6)


def test_basecc_is_the_unbounded_cc_on_units() -> None:
    xs = bern(300, 0.4, 1)
    for base in ("tree", "sqrt"):
        b = BaseCC(EPS, DELTA, KEY, "id", base=base)
        cc = UnboundedCC(EPS, DELTA, KEY, "id/basecc", UNIT, base)
        for x in xs:
            assert b.update(x) * UNIT == cc.step(UNIT if x else 0)
    with pytest.raises(InvalidParameterError):
        BaseCC(EPS, DELTA, KEY, base="laplace")


@pytest.mark.parametrize("cls", [BaseCC, GaussianCC, LaplaceTree])
def test_error_bound_coverage(cls: type) -> None:
    """|y_t - s_t| <= error_bound(beta) at the final tick (t = 40) in a fraction >= 1 -
    beta of 300 runs (beta = 0.2): failing runs within the Binomial(300, 0.2) 1 - 1e-3
    quantile (false-alarm rate <= 1e-3). Control: a fraction of the bound (1/3; 1/16 for
    LaplaceTree, whose union bound over its Laplace terms is about 10x its std) fails far
    more often."""
    shrink = 16.0 if cls is LaplaceTree else 3.0
    beta, runs = 0.2, 300
    fails = ctrl = 0
    for r in range(runs):
        c = cls(EPS, DELTA, KEY, f"cov{r}")
        s = 0.0
        for x in bern(40, 0.3, 1000 + r):
            c.update(x)
            s += x or 0.0
        err = abs(c.y - s)
        fails += err > c.error_bound(beta)
        ctrl += err > c.error_bound(beta) / shrink
    limit = failure_count_limit(runs, beta)
    assert fails <= limit
    assert ctrl > limit


def test_laplace_tree_variance_matches_sigma() -> None:
    """Mean of ((y_t - s_t)/sigma_t)^2 over 1500 LaplaceTree runs at t = 6 is 1 (z-test at
    1e-3). Control: a sigma 1.5 times too small (too little noise claimed) is rejected."""
    t = 6
    z = np.empty(1500)
    sig = laplace_tree_sigma_units(EPS, t) / UNIT
    for i in range(1500):
        c = LaplaceTree(EPS, DELTA, KEY, f"l{i}")
        s = 0.0
        for x in bern(t, 0.5, 5000 + i):
            c.update(x)
            s += x or 0.0
        z[i] = (c.y - s) / sig
    assert not unit_variance_rejects(z)
    assert unit_variance_rejects(z * 1.5)


def test_partitioncc_parameters_follow_the_reading() -> None:
    p = partitioncc_parameters(2.0, DELTA, 10_000)
    assert p.eps_svt == 1.0 and p.cc_eps == 1.0 and p.cc_delta == DELTA
    assert p.tau == pytest.approx(8 * math.log(2 * 10_000 / 0.05) / 1.0)
    assert p.svt_rho_scale == 2.0 and p.svt_nu_scale == 4.0
    with pytest.raises(InvalidParameterError):
        partitioncc_parameters(1.0, DELTA, 0)


def test_partitioncc_releases_only_at_block_ends_and_tracks_the_count() -> None:
    """At eps = 20 blocks hold about tau = 8 ln(4e5)/10 ~ 10 events: the output changes
    only when a block closes (blocks increments), and stays within error_bound(0.05) of
    the true count at every tick of this seeded run (a deterministic check of one run)."""
    c = PartitionCC(20.0, DELTA, KEY, "p", horizon=10_000)
    s = 0.0
    closes = 0
    for x in bern(2000, 0.5, 3):
        before_y, before_blocks = c.y, c.blocks
        c.update(x)
        s += x or 0.0
        if c.blocks != before_blocks:
            closes += 1
        else:
            assert c.y == before_y
        assert abs(c.y - s) <= c.error_bound(0.05)
    assert 40 <= closes <= 200  # about 1000 events in blocks of ~10-20


@pytest.mark.parametrize("cls", [BaseCC, GaussianCC, LaplaceTree, PartitionCC])
def test_skip_is_exactly_n_empty_updates(cls: type) -> None:
    a = cls(EPS, DELTA, KEY, "s")
    b = cls(EPS, DELTA, KEY, "s")
    for x in bern(20, 0.5, 9):
        a.update(x)
        b.update(x)
    changes = a.skip(50)
    want = []
    for _ in range(50):
        before = b.y
        y = b.update(None)
        if y != before:
            want.append((b.t, y))
    assert changes == want and a.to_bytes() == b.to_bytes()
