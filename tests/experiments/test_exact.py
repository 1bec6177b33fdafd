"""Exact advantage of the linear attack against GaussianCC, and the read-off boundaries.

Deterministic tests compare the exact law with brute-force enumeration over every stream.
The Monte Carlo tests use fixed seeds; their stated false-alarm rate is that of the test
for a correct implementation (two-sided z-test on a binomial count at |z| > 4.42: about
1e-5), and each has a control that the same test must reject.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtr
from scipy.stats import binom

from processor.experiments import attack, exact, figures
from processor.simulator.simulate import cc_noise, gaussiancc_sigma_vector

Z_CRIT = 4.42  # two-sided normal tail 1e-5

FIG1A_CSV = Path(__file__).resolve().parents[2] / "docs" / "figures" / "fig1a.csv"


def _enumerate(rates: np.ndarray, b: int) -> dict[float, float]:
    """The law of s(x^(b)) . w by listing all 2^T streams with their probabilities."""
    _, w = attack.weights(rates)
    law: dict[float, float] = {}
    for bits in itertools.product((0, 1), repeat=rates.size):
        x0 = np.array(bits, dtype=np.float64)
        prob = float(np.prod(np.where(x0 == 1, rates, 1 - rates)))
        fed = x0 if b == 0 else np.concatenate(([1.0], x0[:-1]))
        key = round(float(np.cumsum(fed) @ w), 9)
        law[key] = law.get(key, 0.0) + prob
    return law


@pytest.mark.parametrize(("horizon", "low", "high", "width"),
                         [(9, 0.2, 0.7, 2), (10, 0.1, 0.9, 3), (8, 0.3, 0.6, 1)])
def test_statistic_law_equals_enumeration(horizon: int, low: float, high: float,
                                          width: int) -> None:
    rates = attack.block_rates(horizon, low, high, width)
    for b in (0, 1):
        law = exact.statistic_law(rates, b)
        brute = _enumerate(rates, b)
        mine = {round(law.unit * (law.offset + i), 9): float(v)
                for i, v in enumerate(law.pmf) if v > 0}
        assert mine.keys() == brute.keys()
        for k, v in brute.items():
            assert mine[k] == pytest.approx(v, rel=1e-12, abs=1e-15)


def test_gaussian_advantage_equals_enumeration() -> None:
    """Pr[guess 1 | b=1] - Pr[guess 1 | b=0], each the stream-weighted Gaussian tail."""
    rates = attack.block_rates(10, 0.1, 0.9, 2)
    sig = np.linspace(0.3, 1.2, 10)
    c, w = attack.weights(rates)
    theta = attack.threshold(rates)
    sd = math.sqrt(float(np.sum(sig**2 * w**2)))
    guess1 = [sum(p * float(ndtr((c - sw - theta) / sd)) for sw, p in _enumerate(rates, b).items())
              for b in (0, 1)]
    assert exact.gaussian_advantage(rates, sig) == pytest.approx(guess1[1] - guess1[0],
                                                                 rel=1e-12)


def test_suffix_weights_give_the_same_statistic() -> None:
    rates = attack.block_rates(57, 0.25, 0.8, 5)
    x = (np.random.default_rng(3).random((20, 57)) < 0.5).astype(np.float64)
    _, w = attack.weights(rates)
    big_w = exact.suffix_weights(rates)
    assert np.allclose(np.cumsum(x, axis=1) @ w, x @ big_w, atol=1e-12)
    assert big_w[0] == pytest.approx(0.0, abs=1e-15)


def test_weights_off_a_lattice_are_refused() -> None:
    rates = np.array([0.1, 0.5, 0.2, 0.9, 0.9, 0.35])
    with pytest.raises(ValueError, match="multiples"):
        exact.statistic_law(rates, 0)


def test_exact_advantage_agrees_with_the_simulated_attack() -> None:
    """The simulator's attack on GaussianCC (T = 200, eps = 400, 20,000 runs, seed 11)
    against the exact advantage: correct guesses ~ Binomial(N, (1 + adv)/2), so
    |correct - N q| <= 4.42 sd fails with probability ~1e-5 for a correct implementation.
    Control: the exact advantage with sigma scaled by 0.8 (0.325 instead of 0.263, ~9 sd
    away) must be rejected by the same test (power about 1 - 2e-6)."""
    setup = figures.Setup(horizon=200, runs=20_000, seed=11)
    point = figures.run_point(setup, "gaussiancc", 400.0)
    correct = round((point.advantage + 1) / 2 * setup.runs)
    rates = setup.rates()
    sig = gaussiancc_sigma_vector(400.0, setup.delta, setup.horizon)

    def z(adv: float) -> float:
        q = (1 + adv) / 2
        return (correct - setup.runs * q) / math.sqrt(setup.runs * q * (1 - q))

    assert abs(z(exact.gaussian_advantage(rates, sig))) <= Z_CRIT
    assert abs(z(exact.gaussian_advantage(rates, 0.8 * sig))) > Z_CRIT


@pytest.mark.parametrize("base", ["sqrt", "tree"])
def test_basecc_noise_sd_agrees_with_the_simulated_noise(base: str) -> None:
    """Var(n . w) of the simulator's CC noise (T = 200, eps = 1, 20,000 runs, seed 5)
    against basecc_noise_sd^2: the sample variance of N normals has relative sd
    sqrt(2 / (N - 1)); |ratio - 1| <= 4.42 of those fails with probability ~1e-5.
    Control: the same test rejects sd x 0.95 (about 10 sd away)."""
    rates = attack.block_rates(200)
    _, w = attack.weights(rates)
    runs = 20_000
    noise = cc_noise(1.0, 1e-5, runs, 200, np.random.default_rng(5), base)
    var = float(np.var(noise @ w, ddof=1))
    sd = exact.basecc_noise_sd(1.0, 1e-5, rates, base)
    tol = Z_CRIT * math.sqrt(2 / (runs - 1))
    assert abs(var / sd**2 - 1) <= tol
    assert abs(var / (0.95 * sd) ** 2 - 1) > tol


@pytest.mark.parametrize(("base", "eps"), [("sqrt", 4.0), ("tree", 8.0)])
def test_basecc_exact_advantage_agrees_with_the_simulated_attack(base: str, eps: float) -> None:
    """As for GaussianCC: BaseCC at T = 200 (advantage 0.37 and 0.29), 20,000 runs, seed 12,
    z-test at 4.42 sd (false alarm ~1e-5); control: the noise sd x 0.8 (advantage 0.45 and
    0.36, 11 and 10 sd away; power above 1 - 1e-7) is rejected."""
    setup = figures.Setup(horizon=200, runs=20_000, seed=12, base=base)
    point = figures.run_point(setup, "basecc", eps)
    correct = round((point.advantage + 1) / 2 * setup.runs)
    rates = setup.rates()
    sd = exact.basecc_noise_sd(eps, setup.delta, rates, base)

    def z(adv: float) -> float:
        q = (1 + adv) / 2
        return (correct - setup.runs * q) / math.sqrt(setup.runs * q * (1 - q))

    assert abs(z(exact.advantage_given_sd(rates, sd))) <= Z_CRIT
    assert abs(z(exact.advantage_given_sd(rates, 0.8 * sd))) > Z_CRIT


@pytest.mark.parametrize(("adv", "runs", "bound"),
                         [(0.05, 300, 0.1), (0.0, 150, 0.05), (0.12, 400, 0.2), (0.3, 50, 0.1)])
def test_pass_probability_equals_the_direct_sum(adv: float, runs: int, bound: float) -> None:
    q = (1 + adv) / 2
    direct = sum(float(binom.pmf(k, runs, q)) for k in range(runs + 1)
                 if 2 * attack.clopper_pearson(k, runs)[1] - 1 <= bound)
    assert exact.pass_probability(adv, runs, bound) == pytest.approx(direct, abs=1e-12)


def test_issue_figures_at_eps_150() -> None:
    """GaussianCC at eps = 150, T = 10^4, delta = 1e-5: exact advantage 0.0850, and a
    20,000-run experiment reads its CP upper limit <= 0.1 with probability 0.57."""
    rates = attack.block_rates(10_000)
    adv = exact.gaussian_advantage(rates, gaussiancc_sigma_vector(150.0, 1e-5, 10_000))
    assert adv == pytest.approx(0.0850, abs=5e-5)
    assert exact.pass_probability(adv, 20_000, 0.1) == pytest.approx(0.567, abs=1e-3)


def test_boundaries_of_the_committed_table() -> None:
    """On the committed Figure 1a sweep, both GaussianCC entries sit at a boundary (the
    next point passes a repeat with probability 0.57 and 0.53), and BaseCC's at 0.1 (its
    point passes a repeat with probability 0.91); SimECC's do not. Control:
    the same points with every advantage far from the bounds flag nothing."""
    points = figures.read_csv(FIG1A_CSV)
    flagged = {(b.mechanism, b.bound) for b in figures.boundaries(points) if b.at_boundary}
    assert ("gaussiancc", 0.1) in flagged and ("gaussiancc", 0.05) in flagged
    assert ("basecc", 0.1) in flagged and ("basecc", 0.05) not in flagged
    assert ("simecc", 0.1) not in flagged and ("simecc", 0.05) not in flagged
    far = [figures.Point(**{**p.row(), "mechanism": "simecc", "advantage": 0.0,
                            "advantage_low": -0.01, "advantage_high": 0.01})
           for p in points if p.mechanism == "basecc"]
    assert not any(b.at_boundary for b in figures.boundaries(far))
    report = figures.table1_report(points)
    assert "| 0.0850 |" in report and "127.79 ± 0.01 (eps 77.2) *" in report
    assert "49.48 ± 0.03 (eps 150) |" in report  # not marked
