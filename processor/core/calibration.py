"""Calibration of Gaussian noise: the analytic Gaussian mechanism and Gaussian DP.

- gaussian_delta(sigma, eps, sensitivity): the exact delta of adding N(0, sigma^2) to a
  query of the given L2 sensitivity (Balle & Wang 2018, Theorem 8):
      delta = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D).
- analytic_gaussian_sigma(eps, delta, sensitivity, lattice=True): the sigma the core uses.
  With lattice=False it is the smallest sigma with gaussian_delta <= delta (C_{eps,delta}
  of the paper for sensitivity 1). With lattice=True (the default, what the core's
  discrete Gaussians use) it is the smallest sigma with
      gaussian_delta(sigma) * (1 + LATTICE_FLOAT_SLACK) + lattice_excess(sigma) <= delta,
  where lattice_excess bounds |delta of the discrete Gaussian on the integers - delta of
  the continuous one| (see lattice_excess), sensitivity and sigma being in lattice units.
  Both by bisection, returning a sigma that is checked to satisfy the bound (the safe side).
- discrete_gaussian_delta(sigma2, eps, shift, copies): the delta of the discrete Gaussian
  itself, computed in 120-digit decimal arithmetic (an independent check of the above).
- gdp_delta(mu, eps) and gdp_mu(eps, delta): mu-GDP (Dong, Roth, Su 2022) to
  (eps, delta) and back; mu-GDP is exactly the Gaussian mechanism with sigma = 1/mu.

Both Phi terms are taken from their logarithms (scipy.special.log_ndtr), so nothing
underflows even for deltas near 1e-300; tests check deltas down to 1e-17 against a
110-digit reference to 1e-9 relative. Results are cached since every mechanism calls
these at construction.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

from scipy.special import log_ndtr

from processor.core.errors import InvalidParameterError

__all__ = [
    "LATTICE_FLOAT_SLACK",
    "analytic_gaussian_sigma",
    "discrete_gaussian_delta",
    "gaussian_delta",
    "gdp_delta",
    "gdp_mu",
    "lattice_excess",
]

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


#: Relative allowance for the float error of gaussian_delta in the lattice calibration.
#: Its tests hold it to 1e-9 of a 110-digit reference; discrete_gaussian_delta checks the
#: delivered sigmas end to end.
LATTICE_FLOAT_SLACK = 1e-9

_SQRT_2PI = math.sqrt(2.0 * math.pi)
#: integral over the real line of |phi''| for N(0, sigma^2), times sigma^2.
_PHI2_MASS = 4.0 * math.exp(-0.5) / _SQRT_2PI


def _lattice_excess_rel(sigma: float, eps: float, sens: float, delta: float) -> float:
    """lattice_excess(sigma, eps, sens) / delta, computed without underflow."""
    c1 = eps * sigma * sigma / sens - sens / 2.0
    c2 = c1 + sens
    s2 = sigma * sigma
    # Terms proportional to F = phi_sigma(c1) = e^eps phi_sigma(c2): the jump of h' at c1 and
    # the tails of |phi''| beyond c1 and c2 (exact where phi'' keeps its sign, |c| >= sigma).
    lin = sens + (c1 if c1 >= sigma else 0.0) + (c2 if c2 >= sigma else 0.0)
    log_f = -(c1 * c1) / (2.0 * s2) - math.log(_SQRT_2PI * sigma)
    rel = math.exp(log_f - math.log(delta)) * lin / (12.0 * s2)
    # Otherwise the whole-line mass of |phi''| bounds the tail's.
    crude = (1.0 if c1 < sigma else 0.0) + (math.exp(eps) if c2 < sigma else 0.0)
    if crude:
        rel += crude * _PHI2_MASS / (12.0 * s2 * delta)
    return rel


def lattice_excess(sigma: float, eps: float, sensitivity: float = 1.0) -> float:
    """A bound on how far delta_discrete exceeds delta_continuous, sigma and shift in
    lattice units: delta_discrete <= delta_continuous + excess, and delta_discrete >=
    (delta_continuous - excess) / (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2)).

    delta_discrete is the delta(eps) of the discrete Gaussian N_Z(0, sigma^2) on the
    integers against its shift by an integer D = sensitivity; delta_continuous is
    gaussian_delta(sigma, eps, D). With h(x) = [phi(x) - e^eps phi(x + D)]_+ (phi the
    N(0, sigma^2) density), delta_continuous is the integral of h and delta_discrete is
    sum_n h(n) divided by Z / (sqrt(2 pi) sigma) = 1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2) >= 1
    (Z = sum_n exp(-n^2 / (2 sigma^2)), Jacobi's identity).
    h is continuous, zero up to c1 = eps sigma^2 / D - D / 2, with h' of bounded variation,
    so by Euler-Maclaurin |sum_n h(n) - integral h| <= TV(h') * max|B2~| / 2 = TV(h') / 12.
    TV(h') is the jump of h' at c1, D F / sigma^2 (F = phi(c1) = e^eps phi(c1 + D)), plus
    the tails of |phi''| beyond c1 and of e^eps |phi''| beyond c2 = c1 + D; for c >= sigma
    that tail is c phi(c) / sigma^2, else at most the whole-line mass 4 e^-1/2 /
    (sqrt(2 pi) sigma^2). The bound scales like 1/sigma^2 at a fixed sigma / D.

    Product noise with integer shifts (the tree's nodes: D in each of k coordinates) has
    the profile of a one-dimensional discrete Gaussian with a larger sigma at the same
    sigma / ||shift|| (see discrete_gaussian_delta), so the bound at (sigma, ||shift||) in
    lattice units covers it too.
    """
    s = _positive("sigma", sigma)
    e = _positive("eps", eps)
    d = _positive("sensitivity", sensitivity)
    return _lattice_excess_rel(s, e, d, 1.0)


def _lattice_ok(sigma: float, eps: float, sens: float, delta: float) -> bool:
    d = _gaussian_delta(sigma, eps, sens)
    return (d / delta) * (1.0 + LATTICE_FLOAT_SLACK) + _lattice_excess_rel(sigma, eps, sens,
                                                                            delta) <= 1.0


@lru_cache(maxsize=1024)
def _analytic_sigma(eps: float, delta: float, sens: float, lattice: bool = True) -> float:
    def ok(s: float) -> bool:
        if lattice:
            return _lattice_ok(s, eps, sens, delta)
        return _gaussian_delta(s, eps, sens) <= delta

    # Both conditions fail as sigma -> 0 and hold as sigma -> inf.
    hi = sens
    while not ok(hi):
        hi *= 2.0
    lo = hi
    while ok(lo):
        lo /= 2.0
    # Invariant: ok(hi) and not ok(lo).
    while hi - lo > REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    sigma = hi
    # Safe side: the returned sigma itself meets the bound (hi always did; checked anyway).
    if not ok(sigma):  # pragma: no cover - invariant
        raise AssertionError("analytic Gaussian calibration is not on the safe side")
    return sigma


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float = 1.0, *,
                            lattice: bool = True) -> float:
    """The sigma for an (eps, delta) Gaussian release of a query of this L2 sensitivity.

    lattice=True (the default, what the core's discrete Gaussians use): sigma and
    sensitivity are in units of the integer lattice the noise is drawn on, and the returned
    sigma makes both N(0, sigma^2) and the discrete Gaussian N_Z(0, sigma^2) (eps, delta)-DP
    for integer shifts of L2 norm <= sensitivity: gaussian_delta(sigma) *
    (1 + LATTICE_FLOAT_SLACK) + lattice_excess(sigma) <= delta. At the core's sigmas
    (sensitivity UNIT) the excess is 4e-12 * delta at eps = 0.01, 1e-9 at eps = 1 and
    2e-7 at eps = 50 (it grows like eps / sigma^2), so this sigma is above the continuous
    one by a relative 3e-11 to 3e-9.

    lattice=False: the smallest sigma with gaussian_delta(sigma) <= delta, i.e. the paper's
    C_{eps,delta} * sensitivity for the continuous Gaussian only.

    Bisection to relative tolerance REL_TOL (1e-12); the returned value is the upper end of
    the final bracket, verified to satisfy its condition, and at most a factor (1 + 1e-12)
    above the smallest sigma that does.
    """
    return _analytic_sigma(_positive("eps", eps), _delta_in("delta", delta),
                           _positive("sensitivity", sensitivity), bool(lattice))


# --------------------------------------------------------------------------- exact discrete delta

_DEC_PREC = 120
_DEC_PI = Decimal("3.14159265358979323846264338327950288419716939937510"
                  "58209749445923078164062862089986280348253421170679"
                  "8214808651328230664709384460955058223172535940812848")
#: Cramer's bound |He_n(x)| exp(-x^2 / 4) <= K sqrt(n!), K = 1.0864...; rounded up.
_CRAMER_K = Decimal("1.0865")
#: Absolute error allowed in each tail probability: deltas down to 1e-70 (the core's CC
#: inside ECC at eps = 150) are still computed to 1e-20 relative.
_EM_TOL = Decimal(10) ** -90


def _dec_erfc(x: Decimal) -> Decimal:
    """erfc(x) to about _DEC_PREC digits, in the current decimal context (raised inside)."""
    if x < 0:
        return 2 - _dec_erfc(-x)
    with localcontext() as ctx:
        if x <= 6:
            # Taylor series of erf: its terms grow to ~e^(x^2) (<= 1e16) and 1 - erf cancels
            # another ~x^2 / ln 10 (<= 16) digits; 40 guard digits cover both.
            ctx.prec = _DEC_PREC + 40
            z2 = x * x
            term = x  # (-1)^n x^(2n+1) / n!
            total = Decimal(0)
            n = 0
            tiny = Decimal(10) ** -(_DEC_PREC + 30)
            while True:
                contrib = term / (2 * n + 1)
                total += contrib
                if n > 2 and abs(contrib) < tiny:
                    break
                n += 1
                term = -term * z2 / n
            result = 1 - 2 * total / _DEC_PI.sqrt()
        else:
            # Laplace's continued fraction, evaluated backwards from depth N: for x > 6 the
            # relative truncation error is about exp(-2 sqrt(2 N) x) < 1e-127 at N = 300.
            ctx.prec = _DEC_PREC + 20
            tail = Decimal(0)
            for k in range(300, 0, -1):
                tail = (Decimal(k) / 2) / (x + tail)
            result = (-(x * x)).exp() / (_DEC_PI.sqrt() * (x + tail))
    return +result


def _bernoulli_even(p: int) -> list[Fraction]:
    """[B_2, B_4, ..., B_2p] (exact), by the recurrence sum_{k<=n} C(n+1, k) B_k = 0."""
    b = [Fraction(1)]
    for n in range(1, 2 * p + 1):
        b.append(-sum((Fraction(math.comb(n + 1, k)) * b[k] for k in range(n)),
                      Fraction(0)) / (n + 1))
    return [b[2 * j] for j in range(1, p + 1)]


def _em_terms(sigma: Decimal) -> int:
    """The number p of Euler-Maclaurin correction terms that brings the remainder below
    _EM_TOL * sigma (so below _EM_TOL as a probability, Z >= sqrt(2 pi) sigma).

    |R_p| <= (2 zeta(2p) / (2 pi)^(2p)) * integral |g^(2p)| with g(x) = exp(-x^2/(2 s^2)),
    |g^(2p)(x)| = s^-2p |He_2p(x/s)| g(x) <= s^-2p K sqrt((2p)!) exp(-x^2 / (4 s^2)) (Cramer),
    whose integral over the line is 2 sqrt(pi) s; zeta(2p) <= pi^2 / 6.
    """
    zeta = _DEC_PI * _DEC_PI / 6
    two_pi_s = 2 * _DEC_PI * sigma
    for p in range(1, 400):
        bound = (2 * zeta * _CRAMER_K * Decimal(math.factorial(2 * p)).sqrt()
                 * 2 * _DEC_PI.sqrt() * sigma / two_pi_s ** (2 * p))
        if bound <= _EM_TOL * sigma:
            return p
    raise InvalidParameterError("sigma too small for the Euler-Maclaurin tail sums")


def _dec_tail(m: int, sigma: Decimal, bern: list[Fraction]) -> Decimal:
    """sum_{n >= m} exp(-n^2 / (2 sigma^2)) by Euler-Maclaurin with len(bern) corrections:
    integral_m^inf g + g(m)/2 - sum_j B_2j / (2j)! g^(2j-1)(m), where
    g^(k)(x) = (-1)^k sigma^-k He_k(x / sigma) g(x) (He: probabilists' Hermite)."""
    md = Decimal(m)
    u = md / sigma
    g = (-(u * u) / 2).exp()
    total = sigma * (_DEC_PI / 2).sqrt() * _dec_erfc(u / Decimal(2).sqrt()) + g / 2
    he_prev, he = Decimal(1), u  # He_0, He_1
    k = 1
    for j, bj in enumerate(bern, start=1):
        while k < 2 * j - 1:  # advance to He_{2j-1}
            he_prev, he = he, u * he - k * he_prev
            k += 1
        deriv = -(he * g) / sigma ** (2 * j - 1)  # (-1)^(2j-1) = -1
        total -= Decimal(bj.numerator) / Decimal(bj.denominator) / math.factorial(2 * j) * deriv
    return total


def discrete_gaussian_delta(sigma2: Fraction | tuple[int, int], eps: float, shift: int,
                            copies: int = 1) -> Decimal:
    """The delta(eps) of the discrete Gaussian against an integer shift, to ~1e-90 absolute.

    One coordinate (copies = 1): X ~ N_Z(0, sigma^2) on the integers, P(X = n) =
    exp(-n^2 / (2 sigma^2)) / Z, against X + shift. The privacy loss at n is
    (2 n D + D^2) / (2 sigma^2), so (Canonne, Kamath, Steinke 2020, Theorem 7)
        delta = P[X > c1] - e^eps P[X > c1 + D],  c1 = eps sigma^2 / D - D / 2.
    c1 is formed exactly (rational), the tail sums by Euler-Maclaurin with a proven
    remainder bound, Z by Jacobi's identity Z = sqrt(2 pi) sigma (1 + 2 sum_k
    exp(-2 pi^2 sigma^2 k^2)), all in 120-digit decimal arithmetic.

    copies = k: k independent coordinates with the same sigma, each shifted by D (the k
    tree nodes one input enters). The privacy loss is k D^2 / (2 sigma^2) + (D / sigma^2) S
    with S the sum of the k draws, and S ~ N_Z(0, k sigma^2) up to a total variation of
    order exp(-pi^2 sigma^2 / 2) (the characteristic function of N_Z(0, sigma^2) is the
    2 pi-periodised Gaussian one), so this is the one-coordinate delta at
    (k sigma^2, k D). Needs sigma >= 8 (sigma^2 >= 64).
    """
    s2 = Fraction(*sigma2) if isinstance(sigma2, tuple) else Fraction(sigma2)
    if s2 < 64:
        raise InvalidParameterError(f"discrete_gaussian_delta needs sigma^2 >= 64, got {s2}")
    e = _positive("eps", eps)
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 1:
        raise InvalidParameterError(f"shift must be a positive integer, got {shift!r}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise InvalidParameterError(f"copies must be a positive integer, got {copies!r}")
    s2 *= copies
    dd = shift * copies
    c1 = Fraction(e) * s2 / dd - Fraction(dd, 2)
    m1 = math.floor(c1) + 1  # P[X > c1] = P[X >= m1]; a point on c1 contributes 0 anyway
    with localcontext() as ctx:
        ctx.prec = _DEC_PREC
        sigma = (Decimal(s2.numerator) / Decimal(s2.denominator)).sqrt()
        bern = _bernoulli_even(_em_terms(sigma))
        t1 = _dec_tail(m1, sigma, bern)
        t2 = _dec_tail(m1 + dd, sigma, bern)
        theta = Decimal(0)
        k = 1
        while True:
            term = (-2 * _DEC_PI * _DEC_PI * sigma * sigma * k * k).exp()
            if term < Decimal(10) ** -(_DEC_PREC + 5):
                break
            theta += term
            k += 1
        z = (2 * _DEC_PI).sqrt() * sigma * (1 + 2 * theta)
        result = (t1 - Decimal(e).exp() * t2) / z
    return result  # all 120 digits (a unary + here would round to the caller's context)


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
