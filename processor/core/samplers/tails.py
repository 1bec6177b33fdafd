"""Closed-form tail probabilities of scalar.discrete_laplace (for bounds and tests)."""

from __future__ import annotations

import math

from processor.core.samplers.scalar import check_int

__all__ = ["dlap_log_sf", "dlap_sf"]

def _log1mexp(a: float) -> float:
    """log(1 - exp(a)) for a < 0, stable at both ends (Maechler 2012)."""
    if a > -math.log(2.0):
        return math.log(-math.expm1(a))
    return math.log1p(-math.exp(a))


def dlap_log_sf(k: int, t: int, s: int = 1) -> float:
    """log P(Z > k) for Z ~ discrete_laplace(t, s); finite for any integer k.

    With q = exp(-s/t): P(Z > k) = q^(k+1) / (1 + q) for k >= 0, and by symmetry
    1 - q^(-k) / (1 + q) for k < 0.
    """
    k = int(k)
    t = check_int("t", t, 1)
    s = check_int("s", s, 1)
    lam = s / t
    log1pq = math.log1p(math.exp(-lam))
    if k >= 0:
        return -(k + 1) * lam - log1pq
    return _log1mexp(k * lam - log1pq)


def dlap_sf(k: int, t: int, s: int = 1) -> float:
    """P(Z > k) for Z ~ discrete_laplace(t, s) (see dlap_log_sf)."""
    k = int(k)
    t = check_int("t", t, 1)
    s = check_int("s", s, 1)
    if k >= 0:
        return math.exp(dlap_log_sf(k, t, s))
    lam = s / t
    return -math.expm1(k * lam - math.log1p(math.exp(-lam)))
