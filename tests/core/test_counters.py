"""Tests of the internal unit counters: GaussianTree, SqrtFactor, LaplaceTreeBounded,
UnboundedCC and BCC (bounded.py, cc.py).

Statistical tests use fixed seeds (NoiseKey.from_seed), so their outcome is deterministic;
each states the false-alarm rate it would have on a fresh seed and runs a control: the
same check applied with a deliberately wrong constant must fail.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

from processor.core.bounded import (
    GaussianTree,
    LaplaceTreeBounded,
    SqrtFactor,
    UnitCounter,
    sqrt_coeffs,
    tree_reference,
    tree_sigma,
)
from processor.core.calibration import analytic_gaussian_sigma
from processor.core.cc import (
    BCC,
    UnboundedCC,
    bcc_alpha,
    bcc_eta,
    bcc_offset,
    cc_sigma,
    cc_sigma_max,
)
from processor.core.errors import InvalidInputError, StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey

EPS, DELTA = 1.0, 1e-5
KEY = NoiseKey.from_seed(7)

# ------------------------------------------------------------------ statistical helpers

#: Per-check false-alarm rate on a fresh seed.
ALPHA = 1e-3


def normal_fit_rejects(z: np.ndarray, alpha: float = ALPHA) -> bool:
    """True if z (meant to be i.i.d. N(0, 1)) fails either of two checks, each at alpha/2:
    Kolmogorov-Smirnov against N(0, 1) (shape, location) and the two-sided chi-square test
    of sum z^2 ~ chi2(n) (scale). False-alarm rate <= alpha. (The discrete Gaussians here
    have sigma of thousands of units, so their standardised law is N(0, 1) far beyond what
    these sample sizes resolve.)"""
    z = np.asarray(z, dtype=np.float64)
    n = len(z)
    ks = stats.kstest(z, "norm").pvalue
    q = float(np.sum(z * z))
    lo, hi = stats.chi2.ppf(alpha / 4, n), stats.chi2.ppf(1 - alpha / 4, n)
    return bool(ks < alpha / 2 or not lo <= q <= hi)


def unit_variance_rejects(z: np.ndarray, alpha: float = ALPHA) -> bool:
    """True if mean(z^2) differs from 1 by a two-sided large-sample z-test at level alpha
    (for standardised noise that is not Gaussian, e.g. sums of discrete Laplace)."""
    z2 = np.asarray(z, dtype=np.float64) ** 2
    se = float(np.std(z2, ddof=1)) / math.sqrt(len(z2))
    return bool(abs(float(np.mean(z2)) - 1.0) > stats.norm.ppf(1 - alpha / 2) * se)


def failure_count_limit(runs: int, beta: float, alpha: float = ALPHA) -> int:
    """The most failing runs consistent with a failure rate <= beta: Binomial(runs, beta)
    exceeds it with probability <= alpha."""
    return int(stats.binom.ppf(1 - alpha, runs, beta))


def unit_inputs(n: int, seed: int) -> list[int]:
    """Inputs in units: ⊥ (0), whole events, and grid fractions."""
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.choice([0, 0, UNIT, UNIT, UNIT // 2, 12345], n)]


def errors_at(factory: Any, n_inst: int, t: int, seed: int) -> tuple[np.ndarray, float]:
    """y_t - s_t (units) of n_inst independent instances (distinct labels), and sigma(t)."""
    errs = np.empty(n_inst)
    sig = 0.0
    for i in range(n_inst):
        c = factory(f"inst{i}")
        xs = unit_inputs(t, seed + i)
        y = 0
        for u in xs:
            y = c.step(u)
        errs[i] = y - sum(xs)
        sig = c.sigma(t)
    return errs, sig


# ------------------------------------------------------------------ exact structure


@pytest.mark.parametrize("horizon", [1, 2, 7, 64, 100])
def test_fast_tree_equals_dense_reference(horizon: int) -> None:
    xs = unit_inputs(horizon, horizon)
    for tree in (GaussianTree(EPS, DELTA, horizon, KEY, f"ref{horizon}"),
                 LaplaceTreeBounded(EPS, horizon, KEY, f"lref{horizon}")):
        want = tree_reference(tree, KEY, xs)
        got = []
        for i, u in enumerate(xs):
            got.append(tree.step(u))
            if i % 13 == 5:  # restore mid-way: must not change anything
                tree = type(tree).from_state(tree.to_state(), KEY)
        assert got == want


def test_tree_state_is_logarithmic() -> None:
    tree = GaussianTree(EPS, DELTA, 1 << 20, KEY, "big")
    for u in unit_inputs(1000, 3):
        tree.step(u)
    assert len(tree.to_state()["z"]) == 21


def test_sqrt_coefficients_are_exact_and_square_to_the_counting_matrix() -> None:
    c = sqrt_coeffs(60)
    for j in range(60):
        exact = Fraction(math.comb(2 * j, j), 4**j)
        assert c[j] == pytest.approx(float(exact), rel=1e-13)
    n = 60
    b = np.zeros((n, n))
    for i in range(n):
        b[i, : i + 1] = c[: i + 1][::-1]
    assert np.allclose(b @ b, np.tril(np.ones((n, n))), atol=1e-12)


def test_sigma_formulas_follow_the_calibration() -> None:
    """sigma(t) recomputed here from analytic_gaussian_sigma, independently of the module."""
    def c2(eps: float, delta: float, sens: float) -> float:
        return analytic_gaussian_sigma(eps, delta, sens) ** 2

    # Tree of horizon 100: 7 levels; prefix 7 = 3 nodes.
    want = math.sqrt(3 * c2(EPS, DELTA, UNIT * math.sqrt(7)))
    assert tree_sigma(EPS, DELTA, 100, 7) == pytest.approx(want, rel=1e-9)
    # CC at t = 12: intervals I_1..I_3 done (K = 3); I_4 = [8, 15] runs with a tree of
    # horizon 7 (3 levels) at local time 5 (2 nodes).
    want = math.sqrt(3 * c2(EPS / 2, DELTA / 2, UNIT)
                     + 2 * c2(EPS / 2, DELTA / 2, UNIT * math.sqrt(3)))
    assert cc_sigma(EPS, DELTA, 12, "tree") == pytest.approx(want, rel=1e-9)
    # At t = 2^j - 1 only the interval sums contribute.
    assert cc_sigma(EPS, DELTA, 15, "tree") == pytest.approx(
        math.sqrt(4 * c2(EPS / 2, DELTA / 2, UNIT)), rel=1e-9)
    # sqrt base: sigma_z = C ||col 1||, noise at local time tau uses sum_{j<tau} c_j^2.
    c = sqrt_coeffs(7)
    want = math.sqrt(3 * c2(EPS / 2, DELTA / 2, UNIT)
                     + c2(EPS / 2, DELTA / 2, UNIT * math.sqrt(float(np.sum(c * c))))
                     * float(np.sum(c[:5] ** 2)))
    assert cc_sigma(EPS, DELTA, 12, "sqrt") == pytest.approx(want, rel=1e-9)
    assert UnboundedCC.cc_sigma(EPS, DELTA, 12, "tree") == cc_sigma(EPS, DELTA, 12, "tree")


def test_sqrt_base_costs_less_error_than_tree_base() -> None:
    for t in (10**3, 10**4, 10**5):
        assert cc_sigma(EPS, DELTA, t, "sqrt") < cc_sigma(EPS, DELTA, t, "tree")


def test_unit_counters_reject_bad_input_without_changing_state() -> None:
    counters: list[UnitCounter] = [
        GaussianTree(EPS, DELTA, 3, KEY, "v1"), SqrtFactor(EPS, DELTA, 3, KEY, "v2"),
        LaplaceTreeBounded(EPS, 3, KEY, "v3"), UnboundedCC(EPS, DELTA, KEY, "v4"),
        BCC(EPS, DELTA, KEY, "v5")]
    for c in counters:
        c.step(1)
        before = c.to_state()
        for bad in (-1, True, 1.0, "1", None):
            with pytest.raises(InvalidInputError):
                c.step(bad)  # type: ignore[arg-type]
            assert c.to_state() == before
    tree = counters[0]
    tree.step(0)
    tree.step(0)
    with pytest.raises(InvalidInputError):
        tree.step(0)  # horizon 3 exhausted


@pytest.mark.parametrize("make", [
    lambda: UnboundedCC(EPS, DELTA, KEY, "r1"),
    lambda: UnboundedCC(EPS, DELTA, KEY, "r2", base="sqrt"),
    lambda: UnboundedCC(EPS, 0.0, KEY, "r3", base="laplace"),
    lambda: BCC(EPS, DELTA, KEY, "r4", sensitivity=1),
    lambda: SqrtFactor(EPS, DELTA, 50, KEY, "r5"),
])
def test_unit_counter_restore_continues_identically(make: Any) -> None:
    xs = unit_inputs(50, 1)
    if isinstance(make(), BCC):
        xs = [u // UNIT for u in xs]  # BCC takes raw counts
    a = make()
    want = [a.step(u) for u in xs]
    b = make()
    got = []
    for i, u in enumerate(xs):
        if i in (1, 2, 3, 7, 8, 31, 32, 33):
            b = type(b).from_state(b.to_state(), KEY)
        got.append(b.step(u))
    assert got == want
    state = b.to_state()
    for field in state:
        for value in ([1], None):
            bad = dict(state)
            bad[field] = value
            with pytest.raises(StateFormatError):
                type(b).from_state(bad, KEY)


# ------------------------------------------------------------------ noise calibration


def test_gaussian_tree_noise_matches_sigma() -> None:
    """y_t - s_t of 1500 independent trees (horizon 12, t = 7: three nodes), standardised
    by sigma(7), is N(0, 1). False-alarm rate 1e-3. Control: standardising by a sigma that
    is 12% too large (as if levels were counted one too many) is rejected."""
    errs, sig = errors_at(lambda lab: GaussianTree(EPS, DELTA, 12, KEY, lab), 1500, 7, 100)
    assert not normal_fit_rejects(errs / sig)
    wrong = tree_sigma(EPS, DELTA, 12, 7) * math.sqrt(5 / 4)  # 5 levels instead of 4
    assert normal_fit_rejects(errs / wrong)


@pytest.mark.parametrize("base", ["tree", "sqrt"])
def test_unbounded_cc_noise_matches_sigma(base: str) -> None:
    """y_t - s_t of 1200 independent CCs at t = 6 (two interval sums done, the I_3 counter
    at local time 3), standardised by sigma(6), is N(0, 1). False-alarm rate 1e-3.
    Control: sigma without the running interval's counter (interval sums only) is
    rejected."""
    errs, sig = errors_at(lambda lab: UnboundedCC(EPS, DELTA, KEY, lab, base=base), 1200, 6, 200)
    assert not normal_fit_rejects(errs / sig)
    only_sums = cc_sigma(EPS, DELTA, 3, base)
    assert normal_fit_rejects(errs / only_sums)


def test_laplace_base_variance_matches_sigma() -> None:
    """Discrete Laplace variant: mean of ((y_t - s_t)/sigma)^2 is 1 (two-sided z-test at
    1e-3 over 1500 instances, t = 6). Control: sigma with the continuous Laplace variance
    of half the scale (a wrong calibration) is rejected."""
    errs, sig = errors_at(lambda lab: UnboundedCC(EPS, 0.0, KEY, lab, base="laplace"), 1500, 6,
                          300)
    assert not unit_variance_rejects(errs / sig)
    assert unit_variance_rejects(errs / (sig / 2))


# ------------------------------------------------------------------ accuracy (alpha)


def _max_ratio_runs(factory: Any, runs: int, horizon: int, bound: Any, seed: int) -> list[bool]:
    """For each run: did |y_t - s_t| exceed bound(counter, t) at some t <= horizon?"""
    failed = []
    for r in range(runs):
        c = factory(f"acc{r}")
        s = 0
        bad = False
        for u in unit_inputs(horizon, seed + r):
            y = c.step(u)
            s += u
            if abs(y - s) > bound(c, c.t):
                bad = True
        failed.append(bad)
    return failed


def test_cc_accuracy_alpha_holds_for_all_t() -> None:
    """|y_t - s_t| <= alpha(beta, t) for all t <= 48 holds in a fraction >= 1 - beta of
    150 runs (beta = 0.2): the count of failing runs stays within the Binomial(150, 0.2)
    1 - 1e-3 quantile (false-alarm rate <= 1e-3). Control: the bound sigma(t) alone (tail
    factor 1) fails in far more runs."""
    beta = 0.2
    runs = 150
    fails = _max_ratio_runs(lambda lab: UnboundedCC(EPS, DELTA, KEY, lab), runs, 48,
                            lambda c, t: c.alpha(beta, t), 400)
    limit = failure_count_limit(runs, beta)
    assert sum(fails) <= limit
    ctrl = _max_ratio_runs(lambda lab: UnboundedCC(EPS, DELTA, KEY, lab), runs, 48,
                           lambda c, t: c.sigma(t), 400)
    assert sum(ctrl) > limit


def test_bcc_is_an_integer_that_never_underestimates_and_is_accurate() -> None:
    """BCC on raw tick counts (sensitivity 1 and the default fine lattice): integer output,
    y_t >= s_t always, and 0 <= y_t - s_t <= alpha_BCC(beta, t) for all t <= 40 in a
    fraction >= 1 - beta of 120 runs (beta = 0.2; failing-run count within the
    Binomial(120, 0.2) 1 - 1e-3 quantile, false-alarm rate <= 1e-3). Control: the bias
    shift alone, alpha_CC(eps, delta/2, eta, t), as the bound fails in far more runs (the
    noise lands above it about half the time)."""
    beta, runs, horizon = 0.2, 120, 40
    limit = failure_count_limit(runs, beta)
    for sens in (1, UNIT):
        fails = ctrl = 0
        for r in range(runs):
            b = BCC(EPS, DELTA, KEY, f"bcc{r}", sensitivity=sens)
            rng = np.random.default_rng(500 + r)
            s = 0
            bad = cbad = False
            for d in rng.integers(0, 6, horizon):
                y = b.step(int(d))
                s += int(d)
                assert isinstance(y, int) and y >= s
                if y - s > b.alpha(beta, b.t):
                    bad = True
                if y - s > bcc_offset(EPS, DELTA, b.t, sensitivity=sens) / sens:
                    cbad = True
            fails += bad
            ctrl += cbad
        assert fails <= limit
        assert ctrl > limit
    assert bcc_alpha(EPS, DELTA, 10) > bcc_offset(EPS, DELTA, 10) / UNIT
    assert bcc_eta(EPS, DELTA) == pytest.approx(0.5 * DELTA / (1 + math.e))


@pytest.mark.parametrize("base", ["tree", "sqrt", "laplace"])
def test_cc_sigma_max_is_the_running_maximum(base: str) -> None:
    """cc_sigma_max(t) = max over l <= t of cc_sigma(l), by brute force (cc_sigma is not
    monotone: it drops at l = 2^j - 1 and with the popcount of the local time)."""
    eps, delta = 1.0, 1e-5
    run = 0.0
    drops = 0
    for t in range(1, 700):
        s = cc_sigma(eps, delta, t, base)
        drops += s < run
        run = max(run, s)
        assert cc_sigma_max(eps, delta, t, base) == pytest.approx(run, rel=1e-12)
    assert drops > 0  # the envelope is needed
