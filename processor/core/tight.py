"""The tight calibration of ECC and SimECC (`calibration = "tight"`): the project's own
analysis, beyond the paper. docs/tight-calibration.md holds the proof; this module holds
the parameters it proves and the exact computation of the (eps, delta) they deliver.

The paper (Theorem 4.8) conditions on coupled checkpoint sequences t and f(t), where CC's
inputs are 4-step and BCC's 2-step 1-neighbours (Observation 4.13), and pays for that with
group privacy (Lemma 3.7): CC and BCC at (4 eps/27, e^(-19 eps/27) delta/16) and /8.
Here CC and its biased twin are Gaussian mechanisms: a counter whose sub-mechanisms are
calibrated by the analytic Gaussian at (e, d) is mu-GDP for a 1-step 1-neighbour with
mu^2 = 2 / C_{e,d}^2 (the interval sum and the running counter), k-step neighbours are at
most k mu apart (triangle inequality on the whitened shift), and the pair (CC, BCC without
its clamp) is one Gaussian mechanism with mu_tot^2 = 16 mu_CC^2 + 4 mu_BCC^2. With the
partition's multiplicative loss a (Lemma 4.14: 17 eps_p/3 for Part; the proof of Lemma 6.2:
eps_p for SimPart) and its bad event of probability delta_part, the delivered guarantee is

    eps   = a + b,
    delta = delta_part + e^a (delta_G(b; mu_tot) + excess + (1 + e^b) eta),

delta_G the mu-GDP profile, excess the lattice allowance, eta BCC's clamp probability.

The counters themselves are unchanged: the plan hands UnboundedCC and BCC the (eps, delta)
whose own calibration yields the target mu (and, for BCC, the target eta), so states,
restores and error bounds work as before. `account` recomputes the guarantee from those
handed-over parameters only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from scipy.special import zeta

from processor.core.bounded import check_eps_delta
from processor.core.calibration import (
    LATTICE_FLOAT_SLACK,
    analytic_gaussian_sigma,
    gaussian_delta,
    gdp_mu,
    lattice_excess,
)
from processor.core.cc import bcc_eta
from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.partition import simpart_scale

__all__ = [
    "CALIBRATIONS",
    "Accounting",
    "TightPlan",
    "account",
    "bcc_log_eta",
    "check_calibration",
    "error_proxy",
    "lattice_equivalent",
    "tight_plan",
]

#: The calibrations a counter can use: the paper's constants or this module's.
CALIBRATIONS = ("paper", "tight")

#: Mechanisms the tight analysis covers (both: Observation 4.13 holds for any checkpoint
#: sequence, and the partition enters only through its loss a and its bad event).
MECHANISMS = ("ecc", "simecc")

#: Steps of one edit in CC's and BCC's inputs (Observation 4.13).
CC_STEPS = 4
BCC_STEPS = 2

#: Accuracy proxy used only to choose the budget split (privacy holds for any split): one
#: event every RATE_PROXY ticks, and the std of a counter at a few hundred steps, in units
#: of its per-step noise.
RATE_PROXY = 0.5
SIGMA_PROXY = 7.0
#: Candidate partition budgets eps_p / eps (geometric grid).
_PART_FRACTIONS = tuple(2.0 ** (-k / 4.0) for k in range(4, 33))


def check_calibration(value: object) -> str:
    """"paper" or "tight", else InvalidParameterError naming both."""
    if not isinstance(value, str) or value not in CALIBRATIONS:
        raise InvalidParameterError(
            f"unknown calibration {value!r}; valid: {', '.join(CALIBRATIONS)}")
    return value


def _check_mechanism(mechanism: object) -> str:
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise InvalidParameterError(
            f"the tight calibration covers {', '.join(MECHANISMS)}, not {mechanism!r}")
    return mechanism


@dataclass(frozen=True)
class TightPlan:
    """The parameters of a tightly calibrated ECC or SimECC for (eps, delta).

    eps_part and part_param (Part's tau, or SimPart's mu) configure the partition;
    cc_eps/cc_delta and bcc_eps/bcc_delta are what UnboundedCC and BCC are built with.
    """

    mechanism: str
    eps: float
    delta: float
    eps_part: float
    part_param: float
    cc_eps: float
    cc_delta: float
    bcc_eps: float
    bcc_delta: float


@dataclass(frozen=True)
class Accounting:
    """The guarantee a plan delivers, every term of the bound (see the module docstring)."""

    part_loss: float      # a
    gauss_eps: float      # b = eps - a
    delta_part: float     # bound on Pr[not E]
    mu_cc: float          # CC: GDP mu per 1-step 1-neighbour
    mu_bcc: float         # BCC's inner CC: same
    mu_total: float       # sqrt(16 mu_cc^2 + 4 mu_bcc^2)
    delta_gauss: float    # delta_G(b; mu_total), float slack included
    excess: float         # lattice allowance
    eta: float            # BCC's clamp probability bound
    eps_total: float
    delta_total: float


def _c_cont(eps: float, delta: float) -> float:
    """C_{eps,delta} of the continuous Gaussian: a lower bound on every lattice sigma / S
    the core's analytic calibration returns (lattice=True only adds)."""
    return analytic_gaussian_sigma(eps, delta, 1.0, lattice=False)


def cc_mu(cc_eps: float, cc_delta: float) -> float:
    """GDP mu of UnboundedCC(cc_eps, cc_delta) for one 1-step 1-neighbour: its interval sum
    and its running counter are each calibrated at (cc_eps/2, cc_delta/2)."""
    return math.sqrt(2.0) / _c_cont(cc_eps / 2.0, cc_delta / 2.0)


def bcc_mu(bcc_eps: float, bcc_delta: float) -> float:
    """GDP mu of BCC(bcc_eps, bcc_delta)'s inner UnboundedCC(bcc_eps, bcc_delta/2)."""
    return cc_mu(bcc_eps, bcc_delta / 2.0)


# --------------------------------------------------------------------------- the partition


def simpart_bad(eps_p: float, mu: int) -> float:
    """A bound on Pr[not E] of Lemma 6.2 at the core's rounded-up DLap scale b = t/s:
    Pr[Z <= -k] = r^k / (1 + r), r = e^(-1/b), at k = mu - 2 + ceil(4 ln(l)/eps_p), and
    r^ceil(4 ln(l)/eps_p) <= l^(-kappa), kappa = 4 / (eps_p b); summed over l."""
    t, s = simpart_scale(eps_p)
    r = math.exp(-s / t)
    kappa = 4.0 * s / (eps_p * t)
    return float(r ** (mu - 2) / (1.0 + r) * zeta(kappa, 1))


def _simpart_mu(eps_p: float, delta_part: float) -> int:
    """The smallest mu >= 4 (Lemma 6.2 asks mu > 3) with simpart_bad <= delta_part."""
    t, s = simpart_scale(eps_p)
    r = math.exp(-s / t)
    kappa = 4.0 * s / (eps_p * t)
    # r^(mu-2) <= delta_part (1 + r) / zeta(kappa): solve in logs, then step to be exact.
    need = math.log(delta_part * (1.0 + r) / float(zeta(kappa, 1))) / math.log(r)
    mu = max(4, math.ceil(need) + 2)
    while simpart_bad(eps_p, mu) > delta_part:
        mu += 1
    while mu > 4 and simpart_bad(eps_p, mu - 1) <= delta_part:
        mu -= 1
    return mu


def part_bad(eps_p: float, tau: float) -> float:
    """Lemma 4.14: Pr[not E] <= (pi^2 / 4) e^(-eps_p (tau - 1) / 8)."""
    return math.pi**2 / 4.0 * math.exp(-eps_p * (tau - 1.0) / 8.0)


def _part_tau(eps_p: float, delta_part: float) -> float:
    """Lemma 4.14's threshold for Pr[not E] <= delta_part (tau >= 3 as the lemma asks)."""
    tau = max(3.0, 1.0 + 8.0 * math.log(math.pi**2 / (4.0 * delta_part)) / eps_p)
    while part_bad(eps_p, tau) > delta_part:  # float rounding only
        tau = math.nextafter(tau, math.inf)
    return tau


def part_loss(mechanism: str, eps_p: float) -> float:
    """The partition's multiplicative loss a on coupled sequences: Lemma 4.14 (ii) gives
    17 eps_p / 3 for Part; the proof of Lemma 6.2 (ii) gives eps_p for SimPart (two DLap
    draws, each moved by one, at e^(eps_p/2) each; the lemma states 2 eps_p)."""
    return 17.0 * eps_p / 3.0 if mechanism == "ecc" else eps_p


# --------------------------------------------------------------------------- the counters


def _bisect_increasing(f: Callable[[float], float], target: float, lo: float,
                       hi: float) -> float:
    """The largest x in [lo, hi] (to 1e-12 relative) with f(x) <= target, for increasing f
    with f(lo) <= target."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi or hi - lo <= 1e-12 * hi:
            break
        if f(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _cc_for(mu: float, delta: float) -> tuple[float, float]:
    """(cc_eps, cc_delta) with cc_mu(cc_eps, cc_delta) <= mu, cc_eps as large as the
    bisection allows (the counter's noise at most a hair above the target's). cc_delta is
    delta, or mu/4 if smaller: as cc_eps -> 0, cc_mu tends to about 1.8 cc_delta, which
    must stay below mu."""
    delta = min(delta, mu / 4.0)

    def f(e: float) -> float:
        return cc_mu(e, delta)

    lo = 1e-6
    while f(lo) > mu:
        lo /= 4.0
    hi = lo
    while f(hi) <= mu and hi < 1e4:
        hi *= 2.0
    return _bisect_increasing(f, mu, lo, hi), delta


def _bcc_for(mu: float, eta: float) -> tuple[float, float]:
    """(bcc_eps, bcc_delta) with bcc_eta(bcc_eps, bcc_delta) = eta (to rounding; account
    uses the exact value) and bcc_mu <= mu: bcc_delta = 2 eta (1 + e^bcc_eps). As bcc_eps
    -> 0, bcc_mu tends to about 1.8 eta: a larger eta is first halved below mu / 4 (a
    smaller eta only costs accuracy)."""
    eta = min(eta, mu / 4.0)
    e_max = math.log(1.0 / (2.0 * eta) - 1.0) - 1e-9  # bcc_delta < 1

    def f(e: float) -> float:
        return bcc_mu(e, 2.0 * eta * (1.0 + math.exp(e)))

    lo = 1e-6
    while f(lo) > mu:
        lo /= 4.0
    e = e_max if f(e_max) <= mu else _bisect_increasing(f, mu, lo, e_max)
    return e, 2.0 * eta * (1.0 + math.exp(e))


# --------------------------------------------------------------------------- the plan


def _partition(mechanism: str, eps_p: float, delta_part: float) -> float:
    if mechanism == "ecc":
        return _part_tau(eps_p, delta_part)
    return float(_simpart_mu(eps_p, delta_part))


#: Beyond this Gaussian epsilon e^b overflows and BCC's eta underflows.
_MAX_GAUSS_EPS = 700.0


def _eta(budget: float, b: float) -> float:
    """The clamp's share: budget / (2 (1 + e^b)), 0.0 where it underflows."""
    return budget / (2.0 * (1.0 + math.exp(b))) if b < _MAX_GAUSS_EPS else 0.0


def _proxy(mechanism: str, eps: float, delta: float, frac: float) -> float:
    """The accuracy proxy of one partition budget eps_p = frac * eps (choice only)."""
    eps_p = frac * eps
    a = part_loss(mechanism, eps_p)
    if a >= eps:
        return math.inf
    b = eps - a
    budget = (delta / 2.0) * math.exp(-a)
    eta = _eta(budget, b)
    if not 0.0 < eta < 0.25:
        return math.inf
    mu_tot = gdp_mu(b, budget / 2.0)
    tail = math.sqrt(2.0 * math.log(1.0 / eta))
    # CC's 4 steps against BCC's 2 steps with its clamp shift (tail) at the proxy rate;
    # the optimal mu split makes the Gaussian part of the error (A + B) / mu_tot.
    gauss = SIGMA_PROXY * (CC_STEPS + BCC_STEPS * RATE_PROXY * tail) / mu_tot
    lag_ticks = _partition(mechanism, eps_p, delta / 2.0)
    lag = lag_ticks if mechanism == "ecc" else RATE_PROXY * lag_ticks
    return math.hypot(gauss, lag)


@lru_cache(maxsize=256)
def _plan(mechanism: str, eps: float, delta: float) -> TightPlan:
    frac = min(_PART_FRACTIONS, key=lambda f: _proxy(mechanism, eps, delta, f))
    if not math.isfinite(_proxy(mechanism, eps, delta, frac)):
        raise InvalidParameterError(
            f"eps={eps!r} is too large for the tight calibration at delta={delta!r} "
            "(BCC's clamp probability underflows)")
    eps_p = frac * eps
    a = part_loss(mechanism, eps_p)
    b = eps - a
    part_param = _partition(mechanism, eps_p, delta / 2.0)
    # What the partition's bad event actually costs (SimPart's mu is an integer): the rest
    # of delta goes to e^-a (delta_G + excess + clamp).
    delta_part = (part_bad(eps_p, part_param) if mechanism == "ecc"
                  else simpart_bad(eps_p, int(part_param)))
    budget = (delta - delta_part) * math.exp(-a)
    eta = _eta(budget, b)
    tail = math.sqrt(2.0 * math.log(1.0 / eta))
    big_a, big_b = float(CC_STEPS), BCC_STEPS * RATE_PROXY * tail
    w = big_a / (big_a + big_b)  # share of mu_tot^2 for CC (accuracy choice only)
    shrink = 1.0 - 1e-6          # room for the float slack and the lattice excess
    for _ in range(200):
        mu_tot = gdp_mu(b, budget / 2.0 * shrink)
        mu_c = math.sqrt(w) * mu_tot / CC_STEPS
        mu_b = math.sqrt(1.0 - w) * mu_tot / BCC_STEPS
        cc_eps, cc_delta = _cc_for(mu_c, delta)
        bcc_eps, bcc_delta = _bcc_for(mu_b, eta)
        plan = TightPlan(mechanism, eps, delta, eps_p, part_param, cc_eps, cc_delta,
                         bcc_eps, bcc_delta)
        if account(plan).delta_total <= delta:
            return plan
        shrink *= 1.0 - 1e-4
    raise InvalidParameterError(  # pragma: no cover - the loop converges in a few steps
        f"no tight calibration found for eps={eps!r}, delta={delta!r}")


def tight_plan(mechanism: str, eps: float, delta: float) -> TightPlan:
    """The tight parameters of `mechanism` ("ecc" or "simecc") for (eps, delta), checked by
    `account` to deliver (eps, delta)."""
    m = _check_mechanism(mechanism)
    e, d = check_eps_delta(eps, delta)
    return _plan(m, e, d)


def lattice_equivalent(plan: TightPlan, mu_total: float) -> tuple[float, int]:
    """(sigma, shift) in lattice units of the one-dimensional discrete Gaussian the
    accounting charges for: sigma the smallest sigma among the release's coordinates (each
    is at least UNIT C of its calibration, a step moving it by at most UNIT), and the
    integer shift ceil(sigma mu_total), so shift / sigma >= mu_total."""
    sigma = UNIT * min(_c_cont(plan.cc_eps / 2.0, plan.cc_delta / 2.0),
                       _c_cont(plan.bcc_eps / 2.0, plan.bcc_delta / 4.0))
    return sigma, math.ceil(sigma * mu_total)


def account(plan: TightPlan) -> Accounting:
    """The (eps, delta) a plan delivers, from the parameters it hands to the partition and
    the counters only (the docs' final inequality, term by term).

    The lattice allowance treats the joint discrete Gaussian like the core does for a
    tree's nodes (calibration.lattice_excess): as a one-dimensional discrete Gaussian at
    the smallest sigma among the release's coordinates (the excess only grows as sigma
    shrinks at a fixed ratio) with shift sigma * mu_total.
    """
    a = part_loss(plan.mechanism, plan.eps_part)
    b = plan.eps - a
    if b <= 0.0:
        raise InvalidParameterError("the partition's loss exceeds eps")
    if plan.mechanism == "ecc":
        d_part = part_bad(plan.eps_part, plan.part_param)
    else:
        d_part = simpart_bad(plan.eps_part, int(plan.part_param))
    mu_c = cc_mu(plan.cc_eps, plan.cc_delta)
    mu_b = bcc_mu(plan.bcc_eps, plan.bcc_delta)
    mu_tot = math.sqrt((CC_STEPS * mu_c) ** 2 + (BCC_STEPS * mu_b) ** 2)
    sigma_min, shift = lattice_equivalent(plan, mu_tot)
    d_gauss = gaussian_delta(sigma_min, b, shift) * (1.0 + LATTICE_FLOAT_SLACK)
    excess = lattice_excess(sigma_min, b, shift)
    eta = bcc_eta(plan.bcc_eps, plan.bcc_delta)
    clamp = (1.0 + math.exp(b)) * eta
    total = d_part + math.exp(a) * (d_gauss + excess + clamp)
    return Accounting(a, b, d_part, mu_c, mu_b, mu_tot, d_gauss, excess, eta, a + b, total)


def bcc_log_eta(bcc_eps: float, bcc_delta: float) -> float:
    """ln of BCC's clamp probability bound eta = 0.5 bcc_delta / (1 + e^bcc_eps), in logs
    so that it stays finite where eta itself underflows (bcc_eps of several hundred)."""
    return math.log(0.5 * bcc_delta) - bcc_eps - math.log1p(math.exp(-bcc_eps))


def error_proxy(plan: TightPlan) -> float:
    """The accuracy proxy of any plan's parameters, the paper's constants included (used
    only to choose between plans, never for privacy). The Gaussian part is
    SIGMA_PROXY hypot(1 / mu_CC, RATE_PROXY tail / mu_BCC), which at the tight plan's
    split of mu_tot is the planner's (A + B) / mu_tot; the lag is the partition's."""
    tail = math.sqrt(-2.0 * bcc_log_eta(plan.bcc_eps, plan.bcc_delta))
    gauss = SIGMA_PROXY * math.hypot(1.0 / cc_mu(plan.cc_eps, plan.cc_delta),
                                     RATE_PROXY * tail / bcc_mu(plan.bcc_eps, plan.bcc_delta))
    lag = plan.part_param if plan.mechanism == "ecc" else RATE_PROXY * plan.part_param
    return math.hypot(gauss, lag)
