"""The simulator's building blocks against exact answers (no core runs needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from processor.simulator import params
from processor.simulator import simulate as sim

ALPHA = 1e-3


def _variance_pvalue(noise: np.ndarray, sigmas: np.ndarray) -> float:
    """Two-sided chi-square test of Var(noise[:, t]) = sigmas[t]^2 (mean known to be 0) at
    every t, Bonferroni over t."""
    n = noise.shape[0]
    q = np.sum(noise.astype(np.float64) ** 2, axis=0) / sigmas**2  # ~ chi2(n) under H0
    p = 2 * np.minimum(stats.chi2.cdf(q, n), stats.chi2.sf(q, n))
    return float(min(1.0, p.min() * noise.shape[1]))


@pytest.mark.parametrize("base", ["sqrt", "tree"])
def test_cc_noise_variance_is_the_cores_sigma(base: str) -> None:
    """Per-tick variance of the simulated CC noise equals the core's exact sigma_t^2
    (cc.cc_sigma) for t = 1..300 (crossing several doubling intervals). False-alarm rate
    <= 1e-3 (chi-square per tick, Bonferroni); seed fixed."""
    eps, delta, n = 1.0, 1e-5, 300
    noise = sim.cc_noise(eps, delta, 4000, n, np.random.default_rng(5), base)
    sig = np.array([params.cc_sigma(eps, delta, t, base) for t in range(1, n + 1)])
    assert _variance_pvalue(noise, sig) >= ALPHA


def test_cc_noise_variance_control_rejects_wrong_sigma() -> None:
    """Control: the same test rejects the noise when the inner sigma is off by 10%."""
    eps, delta, n = 1.0, 1e-5, 300
    noise = sim.cc_noise(eps, delta, 4000, n, np.random.default_rng(5), "sqrt")
    sig = np.array([params.cc_sigma(eps, delta, t) for t in range(1, n + 1)])
    assert _variance_pvalue(noise, 1.1 * sig) < ALPHA


def test_cc_noise_is_unbiased_and_correlated_like_the_factorization() -> None:
    """Inside one doubling interval the noise is l + B z: Cov(e_a, e_b) = Var(l) +
    sigma_z^2 sum_{j < la} c_j c_{j + lb - la} (local times la < lb). Checked at one pair
    inside I_5 = [16, 31] by a z-test on the sample covariance (two-sided |z| < 3.3: false
    alarm ~1e-3); control: the covariance without the Toeplitz term is rejected."""
    eps, delta, runs = 1.0, 1e-5, 20000
    noise = sim.cc_noise(eps, delta, runs, 31, np.random.default_rng(9), "sqrt")
    # ticks 16..30 share the inner counter of I_5 (horizon 15) plus l = p_1 + ... + p_4
    a, b = 20, 25  # 1-based ticks; local times 5 and 10
    c = params.sqrt_coeffs(15)
    sz = params.sqrt_z_sigma(eps / 2, delta / 2, 15)
    cp = params.gaussian_constant(eps / 2, delta / 2)
    la, lb = a - 15, b - 15
    want = 4 * cp**2 + sz**2 * float(sum(c[j] * c[j + lb - la] for j in range(la)))
    prod = noise[:, a - 1] * noise[:, b - 1]
    z = (prod.mean() - want) / (prod.std(ddof=1) / math.sqrt(runs))
    assert abs(z) < 3.3
    # control: the covariance without the Toeplitz cross term is rejected
    z_wrong = (prod.mean() - 4 * cp**2) / (prod.std(ddof=1) / math.sqrt(runs))
    assert abs(z_wrong) > 3.3


def test_lay_out_is_schedlist_check() -> None:
    """Releases at a tick hold until the next one; ties take the largest; ticks beyond the
    horizon and invalid slots are ignored; y_0 = 0 before the first release."""
    at = np.array([[3, 2, 5, 9], [1, 1, 4, 4]])
    vals = np.array([[10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, -4.0]])
    ok = np.array([[True, True, True, True], [True, True, True, False]])
    y = sim._lay_out(at, vals, ok, 6)
    assert y.tolist() == [[0, 20, 10, 10, 30, 30], [2, 2, 2, 3, 3, 3]]


def test_dlap_int_matches_the_discrete_laplace_pmf() -> None:
    """Chi-square goodness of fit of dlap_int(scale 2.5) to P(z) ~ exp(-|z|/2.5) on
    |z| <= 10 plus the two tails (false-alarm rate 1e-3); control: scale 3 is rejected."""
    z = sim.dlap_int(2.5, 200_000, np.random.default_rng(3))

    def pvalue(scale: float) -> float:
        r = math.exp(-1 / scale)
        ks = np.arange(-10, 11)
        pmf = (1 - r) / (1 + r) * r ** np.abs(ks)
        tail = (1 - pmf.sum()) / 2
        probs = np.concatenate([[tail], pmf, [tail]])
        obs = np.concatenate([[np.sum(z < -10)], [np.sum(z == k) for k in ks], [np.sum(z > 10)]])
        return float(stats.chisquare(obs, probs * z.size).pvalue)

    assert pvalue(2.5) >= ALPHA
    assert pvalue(3.0) < ALPHA


def test_simpart_first_gap_distribution() -> None:
    """SimECC's first checkpoint is max(1, mu + Z), Z ~ DLap(2/eps_p) on the integers: the
    simulated mean of t_1 - mu is 0 within 4 standard errors (false alarm ~6e-5; mu is
    large enough here that the max never binds)."""
    eps, delta = 20.0, 1e-5
    eps_p, mu = params.simpart(eps, delta)
    times, counts = sim.simpart_times(eps, delta, 20000, 10 * mu, np.random.default_rng(4))
    first = times[:, 0] - mu
    var = 2 * math.exp(-eps_p / 2) / (1 - math.exp(-eps_p / 2)) ** 2
    se = math.sqrt(var / first.size)
    assert abs(first.mean()) < 4 * se
    assert np.all(counts >= 1)
    # control: a gap of mu + 1 (an off-by-one) would be detected
    assert abs(first.mean() - 1) > 4 * se


def test_simulate_rejects_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        sim.simulate("nope", np.zeros((2, 5), dtype=np.int64), 1.0, 1e-5, rng)
    with pytest.raises(ValueError):
        sim.simulate("basecc", np.full((2, 5), 2), 1.0, 1e-5, rng)
    with pytest.raises(ValueError):
        sim.simulate("basecc", np.zeros(5, dtype=np.int64), 1.0, 1e-5, rng)
    with pytest.raises(ValueError):
        sim.simulate("basecc", np.zeros((2, 5), dtype=np.int64), 1.0, 1e-5, rng, base="binary")
