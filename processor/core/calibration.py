"""Calibration of Gaussian noise: the analytic Gaussian mechanism and Gaussian DP.

- gaussian_delta(sigma, eps, sensitivity): the exact delta of adding N(0, sigma^2) to a
  query of the given L2 sensitivity (Balle & Wang 2018, Theorem 8):
      delta = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D).
- analytic_gaussian_sigma(eps, delta, sensitivity): the smallest sigma with
  gaussian_delta <= delta (C_{eps,delta} of the paper for sensitivity 1), by bisection,
  returning a sigma that is checked to satisfy the bound (the safe side).
- gdp_delta(mu, eps) and gdp_mu(eps, delta): mu-GDP (Dong, Roth, Su 2022) to
  (eps, delta) and back; mu-GDP is exactly the Gaussian mechanism with sigma = 1/mu.

Both Phi terms are taken from their logarithms (scipy.special.log_ndtr), so nothing
underflows even for deltas near 1e-300; tests check deltas down to 1e-17 against a
110-digit reference to 1e-9 relative. Results are cached since every mechanism calls
these at construction.
"""

from __future__ import annotations

import math
from functools import lru_cache

from scipy.special import log_ndtr

from processor.core.errors import InvalidParameterError

__all__ = ["analytic_gaussian_sigma", "gaussian_delta", "gdp_delta", "gdp_mu"]

#: Relative width of the final bisection bracket.
REL_TOL = 1e-12


def _positive(name: str, v: object) -> float:
    """A finite real > 0, or InvalidParameterError."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidParameterError(f"{name} must be a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or f <= 0.0:
        raise InvalidParameterError(f"{name} must be finite and > 0, got {v!r}")
    return f


def _delta_in(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidParameterError(f"{name} must be a number, got {type(v).__name__}")
    f = float(v)
    if not 0.0 < f < 1.0:  # also rejects NaN
        raise InvalidParameterError(f"{name} must be in (0, 1), got {v!r}")
    return f


def _delta_from(a: float, b: float, eps: float) -> float:
    """Phi(a) - e^eps Phi(b) for b < a, computed as Phi(a) * (1 - exp(eps + lnPhi(b) - lnPhi(a))).

    Why this form: both terms can be far below the float range of Phi itself, and their
    difference can be much smaller than either; the ratio form loses only the absolute
    error of the log difference, not of the terms.
    """
    la = float(log_ndtr(a))
    lb = float(log_ndtr(b))
    x = eps + lb - la
    if x >= 0.0:  # only by rounding: the true value is >= 0
        return 0.0
    return math.exp(la) * -math.expm1(x)


@lru_cache(maxsize=4096)
def _gaussian_delta(sigma: float, eps: float, sens: float) -> float:
    r = sigma / sens
    return _delta_from(1.0 / (2.0 * r) - eps * r, -1.0 / (2.0 * r) - eps * r, eps)


def gaussian_delta(sigma: float, eps: float, sensitivity: float = 1.0) -> float:
    """The exact delta(eps) of the Gaussian mechanism N(0, sigma^2) at this L2 sensitivity."""
    return _gaussian_delta(_positive("sigma", sigma), _positive("eps", eps),
                           _positive("sensitivity", sensitivity))


@lru_cache(maxsize=1024)
def _analytic_sigma(eps: float, delta: float, sens: float) -> float:
    # delta(sigma) decreases strictly from 1 (sigma -> 0) to 0 (sigma -> inf).
    hi = sens
    while _gaussian_delta(hi, eps, sens) > delta:
        hi *= 2.0
    lo = hi
    while _gaussian_delta(lo, eps, sens) <= delta:
        lo /= 2.0
    # Invariant: delta(lo) > target >= delta(hi).
    while hi - lo > REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _gaussian_delta(mid, eps, sens) <= delta:
            hi = mid
        else:
            lo = mid
    sigma = hi
    # Safe side: the returned sigma itself meets the bound (hi always did; checked anyway).
    if _gaussian_delta(sigma, eps, sens) > delta:  # pragma: no cover - invariant
        raise AssertionError("analytic Gaussian calibration is not on the safe side")
    return sigma


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest sigma such that N(0, sigma^2) is (eps, delta)-DP at this sensitivity.

    Bisection to relative tolerance REL_TOL (1e-12); the returned value is the upper end of
    the final bracket, verified to satisfy gaussian_delta(sigma) <= delta, and at most a
    factor (1 + 1e-12) above the true minimum.
    """
    return _analytic_sigma(_positive("eps", eps), _delta_in("delta", delta),
                           _positive("sensitivity", sensitivity))


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    m = _positive("mu", mu)
    e = _positive("eps", eps)
    return _gdp_delta(m, e)


@lru_cache(maxsize=4096)
def _gdp_delta(mu: float, eps: float) -> float:
    return _delta_from(-eps / mu + mu / 2.0, -eps / mu - mu / 2.0, eps)


@lru_cache(maxsize=1024)
def _gdp_mu(eps: float, delta: float) -> float:
    # gdp_delta increases strictly in mu.
    lo = 1.0
    while _gdp_delta(lo, eps) > delta:
        lo /= 2.0
    hi = lo
    while _gdp_delta(hi, eps) <= delta:
        hi *= 2.0
    # Invariant: delta(lo) <= target < delta(hi).
    while hi - lo > REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _gdp_delta(mid, eps) <= delta:
            lo = mid
        else:
            hi = mid
    if _gdp_delta(lo, eps) > delta:  # pragma: no cover - invariant
        raise AssertionError("GDP calibration is not on the safe side")
    return lo


def gdp_mu(eps: float, delta: float) -> float:
    """The largest mu (to relative 1e-12) with gdp_delta(mu, eps) <= delta, verified."""
    return _gdp_mu(_positive("eps", eps), _delta_in("delta", delta))
