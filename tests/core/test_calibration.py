"""Calibration: analytic Gaussian sigma, Gaussian delta, GDP conversions.

These tests are deterministic (no randomness): each checks a closed form, a published
value, or the safe-side property of a returned parameter.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import pytest
from scipy.stats import norm

from processor.core import calibration as cal
from processor.core.calibration import (
    analytic_gaussian_sigma,
    gaussian_delta,
    gdp_delta,
    gdp_mu,
)
from processor.core.errors import InvalidParameterError

GRID = [(eps, delta) for eps in (0.01, 0.1, 0.5, 1.0, 4.0, 20.0, 150.0)
        for delta in (0.1, 1e-5, 1e-9, 1e-12)]


def _delta_direct(sigma: float, eps: float, sens: float = 1.0) -> float:
    """Balle & Wang Theorem 8 written plainly with norm.cdf (fine for moderate deltas)."""
    a = sens / (2 * sigma) - eps * sigma / sens
    b = -sens / (2 * sigma) - eps * sigma / sens
    return float(norm.cdf(a) - math.exp(eps) * norm.cdf(b))


@pytest.mark.parametrize(("sigma", "eps"), [(1.0, 0.5), (2.0, 1.0), (0.5, 2.0), (5.0, 0.3)])
def test_gaussian_delta_matches_direct_formula(sigma: float, eps: float) -> None:
    assert gaussian_delta(sigma, eps) == pytest.approx(_delta_direct(sigma, eps), rel=1e-9)


def _phi_decimal(x: float) -> Decimal:
    """Phi(x) to ~25 significant digits for -11 < x <= 0, independently of scipy: the
    Taylor series of erf at 110 digits (its terms grow to ~e^(x^2/2) before shrinking,
    and 1 - erf cancels ~x^2/(2 ln 10) more digits; 110 leaves ample margin)."""
    with localcontext() as ctx:
        ctx.prec = 110
        z = Decimal(-x) / Decimal(2).sqrt()
        term = z  # z^(2n+1) (-1)^n / n!
        total = Decimal(0)
        n = 0
        while True:
            contrib = term / (2 * n + 1)
            total += contrib
            if n > 10 and abs(contrib) < Decimal(10) ** -100:
                break
            n += 1
            term = -term * z * z / n
        pi = Decimal("3.14159265358979323846264338327950288419716939937510"
                     "58209749445923078164062862089986280348253421170679")
        erf = 2 * total / pi.sqrt()
        return (1 - erf) / 2


@pytest.mark.parametrize(("sigma", "eps"), [(3.0, 1.0), (6.0, 1.0), (8.0, 1.0), (2.0, 4.0),
                                            (20.0, 0.3)])
def test_gaussian_delta_against_high_precision(sigma: float, eps: float) -> None:
    """Deltas from ~1e-4 down to ~1e-17 agree with a 110-digit reference (computed
    without scipy) to 1e-9 relative. Deterministic: no randomness, no false alarms."""
    a = 1 / (2 * sigma) - eps * sigma
    b = -1 / (2 * sigma) - eps * sigma
    with localcontext() as ctx:
        ctx.prec = 110
        ref = _phi_decimal(a) - Decimal(eps).exp() * _phi_decimal(b)
    assert gaussian_delta(sigma, eps) == pytest.approx(float(ref), rel=1e-9)


def test_gaussian_delta_tiny_values_are_accurate() -> None:
    """Far below where norm.cdf differences are meaningful (delta < 1e-14), the result is
    positive, equals the difference of the two log-space terms, and is monotone."""
    sigma, eps = 8.0, 1.0
    d = gaussian_delta(sigma, eps)
    assert 0 < d < 1e-14
    # Phi(a) - e^eps Phi(b) with each term from its logarithm (no underflow at this size):
    a = 1 / (2 * sigma) - eps * sigma
    b = -1 / (2 * sigma) - eps * sigma
    ratio_terms = (norm.logcdf(a), eps + norm.logcdf(b))
    assert d == pytest.approx(math.exp(ratio_terms[0]) - math.exp(ratio_terms[1]), rel=1e-6)
    assert gaussian_delta(sigma * 1.01, eps) < d < gaussian_delta(sigma * 0.99, eps)


@pytest.mark.parametrize(("eps", "delta"), GRID)
def test_sigma_is_safe_and_minimal(eps: float, delta: float) -> None:
    """The returned sigma satisfies delta; 1e-9 less does not (so it is tight)."""
    sigma = analytic_gaussian_sigma(eps, delta)
    assert gaussian_delta(sigma, eps) <= delta
    assert gaussian_delta(sigma * (1 - 1e-9), eps) > delta


@pytest.mark.parametrize("eps", [0.05, 0.3, 0.9])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_classical_bound_is_an_upper_bound(eps: float, delta: float) -> None:
    """For eps < 1 the classical sigma = sqrt(2 ln(1.25/delta))/eps is private (so it is
    above the analytic minimum), and the analytic sigma is strictly smaller."""
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert gaussian_delta(classical, eps) <= delta
    assert analytic_gaussian_sigma(eps, delta) < classical


@pytest.mark.parametrize(
    ("sens", "eps", "delta", "expected"),
    [
        # Values from the tests of an independent Rust implementation (sds_core,
        # "validate_sigma"), which calibrates the same Balle & Wang condition.
        (math.sqrt(30.0), 6.0, 0.5, 1.4659731497780966),
        (math.sqrt(30.0), 6.0, 1e-5, 4.182602139814776),
        (10.0, 0.1, 1e-5, 307.49566132862844),
    ],
)
def test_published_values(sens: float, eps: float, delta: float, expected: float) -> None:
    assert analytic_gaussian_sigma(eps, delta, sens) == pytest.approx(expected, rel=1e-8)


def test_scaling_and_monotonicity() -> None:
    base = analytic_gaussian_sigma(1.0, 1e-6)
    assert analytic_gaussian_sigma(1.0, 1e-6, 3.0) == pytest.approx(3 * base, rel=1e-11)
    assert analytic_gaussian_sigma(2.0, 1e-6) < base < analytic_gaussian_sigma(0.5, 1e-6)
    assert analytic_gaussian_sigma(1.0, 1e-3) < base < analytic_gaussian_sigma(1.0, 1e-9)
    # delta decreases in sigma and in eps
    assert gaussian_delta(1.0, 1.0) > gaussian_delta(1.5, 1.0) > gaussian_delta(1.5, 2.0)


def test_gdp_is_gaussian_with_sigma_one_over_mu() -> None:
    # Dong, Roth, Su: mu-GDP is the Gaussian mechanism with sigma = 1/mu.
    for mu, eps in [(0.5, 0.5), (1.0, 1.0), (2.0, 3.0)]:
        assert gdp_delta(mu, eps) == pytest.approx(gaussian_delta(1 / mu, eps), rel=1e-12)
    # A hand-computable value: mu = 1, eps = 1 -> Phi(-1/2) - e Phi(-3/2).
    expected = norm.cdf(-0.5) - math.e * norm.cdf(-1.5)
    assert gdp_delta(1.0, 1.0) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-5), (1.0, 1e-5), (10.0, 1e-5), (150.0, 1e-9)])
def test_gdp_mu_is_safe_and_maximal(eps: float, delta: float) -> None:
    mu = gdp_mu(eps, delta)
    assert gdp_delta(mu, eps) <= delta
    assert gdp_delta(mu * (1 + 1e-9), eps) > delta
    assert mu == pytest.approx(1 / analytic_gaussian_sigma(eps, delta), rel=1e-10)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "1"])
def test_invalid_eps(bad: object) -> None:
    with pytest.raises(InvalidParameterError):
        analytic_gaussian_sigma(bad, 1e-5)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        gaussian_delta(1.0, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        gdp_mu(bad, 1e-5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_invalid_delta(bad: float) -> None:
    with pytest.raises(InvalidParameterError):
        analytic_gaussian_sigma(1.0, bad)
    with pytest.raises(InvalidParameterError):
        gdp_mu(1.0, bad)


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf])
def test_invalid_sensitivity_sigma_mu(bad: float) -> None:
    with pytest.raises(InvalidParameterError):
        analytic_gaussian_sigma(1.0, 1e-5, bad)
    with pytest.raises(InvalidParameterError):
        gaussian_delta(bad, 1.0)
    with pytest.raises(InvalidParameterError):
        gdp_delta(bad, 1.0)


def test_results_are_cached() -> None:
    analytic_gaussian_sigma(0.77, 3e-7)
    hits = cal._analytic_sigma.cache_info().hits
    analytic_gaussian_sigma(0.77, 3e-7)
    assert cal._analytic_sigma.cache_info().hits == hits + 1
