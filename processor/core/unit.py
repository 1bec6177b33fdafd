"""Per-unit privacy: from a guarantee per person to the parameters of each counter.

The mechanisms are (eps, delta)-DP for *edit neighbours*: one extra event of one counter.
A privacy unit (a person, a device) may contribute several events. The stream bounds its
contributions before tick assignment: at most k = `max_events_per_counter` kept events per
counter and at most m = `max_counters_per_unit` counters. This module turns the target per
unit (eps_unit, delta_unit) and (k, m) into the per-event (eps, delta) every counter is
built with, and back (what a unit gets from given per-event parameters). The proof is in
docs/privacy-unit.md; in short:

1. Group privacy over the edit relation. k events of one unit in one counter are k
   insertions, each of which turns a valid stream into an edit neighbour of it (the
   intermediate streams are valid: insert the events one at a time). Chaining the
   (eps, delta) inequality k times gives, for every event set Y,
       P[M(s_0) in Y] <= e^(k eps) P[M(s_k) in Y] + delta * (1 + e^eps + ... + e^((k-1) eps)),
   i.e. (k eps, delta * S_k(eps)) with S_k(eps) = (e^(k eps) - 1) / (e^eps - 1), which is at
   most the textbook k e^((k-1) eps) delta.
2. Basic composition over the m counters one unit may touch. The counters draw independent
   noise (keys derived per counter name), a counter the unit does not touch has the same
   output law on both sides, so the whole release is (m k eps, m delta S_k(eps))-DP for the
   addition or removal of one unit.

`derive` inverts this: eps = eps_unit / (m k), delta = delta_unit / (m S_k(eps)), each
rounded down (never up) until the forward computation `unit_guarantee` certifies it.

For ECC and SimECC a second argument applies (docs/privacy-unit.md, "The k-edit coupling"):
the one-edit proof's partition coupling chained over the k edits, so that the partition
pays k times its loss a by group privacy while CC and BCC, one Gaussian mechanism, move by
k mu_tot (triangle inequality) and the m counters compose as Gaussians (sqrt(m) k mu_tot).
`group_account` computes what that gives a unit from a counter's plan; `derive(...,
mechanism=..., calibration=...)` searches the per-event (eps, delta) it certifies and
keeps it only when its plan is more accurate than the basic derivation's.
Pure: no I/O, floats only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final

from processor.core import tight
from processor.core.bounded import check_eps_delta
from processor.core.calibration import LATTICE_FLOAT_SLACK, gdp_delta
from processor.core.errors import InvalidParameterError
from processor.core.params import ecc_parameters, simecc_parameters

#: Largest accepted bound (either one): beyond it the derived epsilon is so small that no
#: counter is useful, and the rounding loops below stay short.
MAX_BOUND: Final = 1_000_000

#: The method names a ledger entry carries (`UnitParameters.method`): group privacy per
#: counter then basic composition, or the k-edit coupling of ECC / SimECC.
METHOD: Final = "group-privacy+basic-composition"
METHOD_COUPLED: Final = "k-edit-coupling+gaussian-composition"

#: Step 6's smoothing (docs/tight-calibration.md): parameter tau in lattice units, its
#: normaliser bound eta = 2 sum_j e^(-2 pi^2 tau^2 j^2), and the shifted noise coordinates
#: charged per edit and counter (a few hundred in practice).
SMOOTHING_TAU: Final = 2.0
SMOOTHING_ETA: Final = 2.0 * math.fsum(
    math.exp(-2.0 * math.pi**2 * SMOOTHING_TAU**2 * j * j) for j in range(1, 8))
COORDS_PER_EDIT: Final = 10**6

#: The mechanisms the k-edit coupling covers.
COUPLED_MECHANISMS: Final = ("ecc", "simecc")
#: How per-event parameters are derived: "coupling" (the better of the k-edit coupling and
#: basic composition, where the coupling applies) or "basic" (group privacy and basic
#: composition only: the derivation of deployments made before the coupling).
DERIVATIONS: Final = ("coupling", "basic")


@dataclass(frozen=True)
class UnitParameters:
    """The derived parameters of one deployment in privacy_unit = "user" mode.

    unit_*: the target per unit (what the operator promises a person); event_*: what each
    counter is built with (the guarantee per event); counter_*: what one counter gives one
    unit (k events; for the coupling, at epsilon unit_epsilon / m); delivered_*: what the
    whole release gives one unit, recomputed forward from event_* (never above the
    target)."""

    unit_epsilon: float
    unit_delta: float
    max_events_per_counter: int
    max_counters_per_unit: int
    event_epsilon: float
    event_delta: float
    counter_epsilon: float
    counter_delta: float
    delivered_epsilon: float
    delivered_delta: float
    method: str = METHOD

    def as_record(self) -> dict[str, object]:
        """The public fields a ledger entry / plan shows."""
        return {
            "unit_epsilon": self.unit_epsilon, "unit_delta": self.unit_delta,
            "max_events_per_counter": self.max_events_per_counter,
            "max_counters_per_unit": self.max_counters_per_unit,
            "event_epsilon": self.event_epsilon, "event_delta": self.event_delta,
            "method": self.method,
        }


def check_bound(name: str, v: object) -> int:
    """A contribution bound: an int in 1..MAX_BOUND (bool rejected)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_BOUND:
        raise InvalidParameterError(f"{name} must be an integer in 1..{MAX_BOUND}, got {v!r}")
    return v


def log_group_sum(k: int, eps: float) -> float:
    """ln S_k(eps) = ln(1 + e^eps + ... + e^((k-1) eps)), without overflow for large k eps.

    S_k = e^((k-1) eps) * (1 - e^(-k eps)) / (1 - e^(-eps)); both factors are computed
    with expm1 so that small eps keeps its precision (S_k -> k as eps -> 0)."""
    if k == 1:
        return 0.0
    # (1 - e^(-k eps)) / (1 - e^(-eps)) = expm1(-k eps) / expm1(-eps), in (1, k].
    return (k - 1) * eps + math.log(math.expm1(-k * eps) / math.expm1(-eps))


def group_guarantee(eps: float, delta: float, k: int) -> tuple[float, float]:
    """What one counter that is (eps, delta)-DP for edit neighbours gives k edits:
    (k eps, delta S_k(eps)) (the chained inequality of docs/privacy-unit.md, Lemma 1)."""
    check_eps_delta(eps, delta)
    check_bound("k", k)
    return k * eps, min(1.0, delta * math.exp(log_group_sum(k, eps)))


def unit_guarantee(eps: float, delta: float, k: int, m: int) -> tuple[float, float]:
    """The forward direction: the (eps, delta) one unit gets from counters built with the
    per-event (eps, delta), bounds k per counter and m counters (Lemma 1 then basic
    composition, Lemma 2). Rounded up: the float result is never below the true value by
    more than the last-bit error of one multiplication, which the caller's margin covers."""
    check_bound("max_counters_per_unit", m)
    ce, cd = group_guarantee(eps, delta, k)
    return m * ce, min(1.0, m * cd)


def derive(unit_epsilon: float, unit_delta: float, max_events_per_counter: int,
           max_counters_per_unit: int, *, mechanism: str | None = None,
           calibration: str = "paper", derivation: str = "coupling") -> UnitParameters:
    """Per-event (eps, delta) of each counter from the target per unit and the bounds.

    Group privacy and basic composition for every mechanism; for ECC and SimECC (either
    calibration) also the k-edit coupling, kept when its plan is more accurate by
    `tight.error_proxy` (k = m = 1 stays the identity). Raises InvalidParameterError
    (naming the parameter) on a bad target or bound, or when the derived delta underflows
    (a target delta too small for the bounds at this eps)."""
    try:
        check_eps_delta(unit_epsilon, unit_delta)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"unit target: {exc}") from None
    k = check_bound("max_events_per_counter", max_events_per_counter)
    m = check_bound("max_counters_per_unit", max_counters_per_unit)
    tight.check_calibration(calibration)
    if derivation not in DERIVATIONS:
        raise InvalidParameterError(
            f"unit derivation must be one of {', '.join(DERIVATIONS)}, got {derivation!r}")
    basic = _basic(float(unit_epsilon), float(unit_delta), k, m)
    if derivation == "basic" or mechanism not in COUPLED_MECHANISMS or k * m == 1:
        return basic
    assert mechanism is not None
    coupled = _coupled(basic.unit_epsilon, basic.unit_delta, k, m, mechanism, calibration)
    if coupled is None:
        return basic
    eps, delta = coupled
    if (tight.error_proxy(plan_for(mechanism, calibration, eps, delta))
            >= tight.error_proxy(plan_for(mechanism, calibration, basic.event_epsilon,
                                          basic.event_delta))):
        return basic
    return _coupled_parameters(basic, mechanism, calibration, eps, delta)


def _basic(unit_epsilon: float, unit_delta: float, k: int, m: int) -> UnitParameters:
    """The derivation by Lemmas 1 and 2 (group privacy, basic composition)."""
    n = k * m
    eps = unit_epsilon / n
    # Round down until the forward product is certified <= the target (floats: eps * n
    # may round up by half an ulp).
    while n * eps > unit_epsilon:
        eps = math.nextafter(eps, 0.0)
    if not eps > 0:
        raise InvalidParameterError("unit target: epsilon / (k m) underflows")
    log_s = log_group_sum(k, eps)
    # Directly when S_k is a float (exact for k = m = 1: event mode is the identity),
    # through logarithms when it would overflow.
    if log_s < 700:
        delta = unit_delta / (m * math.exp(log_s))
    else:
        delta = math.exp(math.log(unit_delta) - math.log(m) - log_s)
    if not delta > 0 or delta < 1e-300:
        raise InvalidParameterError(
            f"unit target: delta {unit_delta!r} is too small for k = {k}, m = {m} at epsilon "
            f"{unit_epsilon!r} (the derived per-event delta underflows)")
    for _ in range(64):
        d_eps, d_delta = unit_guarantee(eps, delta, k, m)
        if d_eps <= unit_epsilon and d_delta <= unit_delta:
            break
        delta = math.nextafter(delta, 0.0) * (1 - 1e-12)
    else:  # pragma: no cover - the float error is a few ulps; 64 steps is far beyond it
        raise InvalidParameterError("unit target: could not certify the derived delta")
    ce, cd = group_guarantee(eps, delta, k)
    return UnitParameters(
        unit_epsilon=float(unit_epsilon), unit_delta=float(unit_delta),
        max_events_per_counter=k, max_counters_per_unit=m,
        event_epsilon=eps, event_delta=delta, counter_epsilon=ce, counter_delta=cd,
        delivered_epsilon=d_eps, delivered_delta=d_delta)


# --------------------------------------------------------------------------- the coupling


@dataclass(frozen=True)
class GroupAccounting:
    """What one unit gets from m ECC / SimECC counters built with one plan, k edits each,
    by the k-edit coupling (docs/privacy-unit.md), every term of its final inequality."""

    part_loss: float    # m k a: the partitions, group privacy then composition
    gauss_eps: float    # b = eps_total - m k a: the Gaussian part's epsilon
    delta_part: float   # m S_k(a) delta_part: the partitions' bad events
    mu_unit: float      # sqrt(m) k mu_tot, lowered sigmas of the smoothing included
    delta_gauss: float  # Gamma delta_G(b - 2 ln Gamma; mu_unit), float slack included
    clamp: float        # (1 + e^b) m eta
    eps_total: float
    delta_total: float


def partitions_charge(k: int, m: int, a: float, delta_part: float) -> tuple[float, float]:
    """The partitions' part of the coupling (Steps C1 and C3 of docs/privacy-unit.md):
    the loss m k a and the bad events' mass m S_k(a) delta_part (the chained coupling
    loses at most e^(i a) delta_part at edit i + 1 of each of the m counters)."""
    return m * k * a, m * delta_part * math.exp(log_group_sum(k, a))


def gaussian_shift(k: int, m: int, mu_tot: float) -> float:
    """The Gaussian part's whitened shift (Steps C2 and C3): k edits along the chain move
    one counter's mean by at most k mu_tot (triangle inequality), m independent counters
    by sqrt(m) k mu_tot (the shifts add in quadrature)."""
    return math.sqrt(m) * k * mu_tot


def plan_for(mechanism: str, calibration: str, eps: float, delta: float) -> tight.TightPlan:
    """The parameters a counter built with (eps, delta) hands to its partition, CC and BCC,
    under either calibration, as a TightPlan (the paper's constants included)."""
    if tight.check_calibration(calibration) == "tight":
        return tight.tight_plan(mechanism, eps, delta)
    if mechanism == "ecc":
        p = ecc_parameters(eps, delta)
        return tight.TightPlan("ecc", eps, delta, p.eps_part, p.tau, p.cc_eps, p.cc_delta,
                               p.bcc_eps, p.bcc_delta)
    q = simecc_parameters(eps, delta)
    return tight.TightPlan("simecc", eps, delta, q.eps_part, float(q.mu), q.cc_eps,
                           q.cc_delta, q.bcc_eps, q.bcc_delta)


def group_account(plan: tight.TightPlan, k: int, m: int,
                  eps_total: float) -> GroupAccounting:
    """The delta one unit gets at eps_total from m counters built with `plan`, at most k
    kept events in each (the k-edit coupling; docs/privacy-unit.md, its final inequality),
    recomputed from the parameters the plan hands to the partition and the counters.
    delta_total is inf where the partitions' loss m k a leaves no Gaussian epsilon, or
    the lattice or Part's threshold is outside the lemmas' range."""
    check_bound("k", k)
    check_bound("m", m)
    a = tight.part_loss(plan.mechanism, plan.eps_part)
    if plan.mechanism == "ecc":
        d_part = tight.part_bad(plan.eps_part, plan.part_param)
    else:
        d_part = tight.simpart_bad(plan.eps_part, int(plan.part_param))
    mu_tot = math.hypot(tight.CC_STEPS * tight.cc_mu(plan.cc_eps, plan.cc_delta),
                        tight.BCC_STEPS * tight.bcc_mu(plan.bcc_eps, plan.bcc_delta))
    sigma_min, _ = tight.lattice_equivalent(plan, mu_tot)
    part, d_part_unit = partitions_charge(k, m, a, d_part)
    # Rounded down: the delta below is computed at an epsilon never above the true one.
    b = (eps_total - part) * (1.0 - 1e-12)
    log_gamma = COORDS_PER_EDIT * k * m * (math.log1p(SMOOTHING_ETA)
                                            - math.log1p(-SMOOTHING_ETA))
    mu_unit = gaussian_shift(k, m, mu_tot)
    if (b - 2.0 * log_gamma <= 0.0 or sigma_min <= SMOOTHING_TAU
            or (plan.mechanism == "ecc" and plan.part_param < 3.0)):
        return GroupAccounting(part, b, math.inf, mu_unit, math.inf, math.inf, eps_total,
                               math.inf)
    mu_unit /= math.sqrt(1.0 - (SMOOTHING_TAU / sigma_min) ** 2)
    d_gauss = (math.exp(log_gamma) * gdp_delta(mu_unit, b - 2.0 * log_gamma)
               * (1.0 + LATTICE_FLOAT_SLACK))
    log_clamp = (math.log(m) + tight.bcc_log_eta(plan.bcc_eps, plan.bcc_delta)
                 + b + math.log1p(math.exp(-b)))
    clamp = math.exp(log_clamp) if log_clamp < 700.0 else math.inf
    return GroupAccounting(part, b, d_part_unit, mu_unit, d_gauss, clamp, eps_total,
                           d_part_unit + d_gauss + clamp)


def coupled_guarantee(eps: float, delta: float, k: int, m: int, mechanism: str,
                      calibration: str, unit_epsilon: float) -> float:
    """The delta one unit gets at unit_epsilon from counters built with the per-event
    (eps, delta) (the coupling; inf where it gives nothing)."""
    try:  # a parameter outside a calibration's range (a delta that underflows) gives inf
        return group_account(plan_for(mechanism, calibration, eps, delta), k, m,
                             unit_epsilon).delta_total
    except InvalidParameterError:
        return math.inf


#: The per-event delta searched lies in [DELTA_FLOOR, unit delta].
DELTA_FLOOR: Final = 1e-300


def _largest_delta(eps: float, unit_epsilon: float, unit_delta: float, k: int, m: int,
                   mechanism: str, calibration: str) -> float | None:
    """The largest per-event delta (to 10%) certified with per-event eps, by a
    secant on ln(delta) (the unit delta grows about linearly in it); None if none is."""
    def excess(log_d: float) -> float:
        got = coupled_guarantee(eps, math.exp(log_d), k, m, mechanism, calibration,
                                unit_epsilon)
        return math.log(got / unit_delta) if 0.0 < got < math.inf else math.inf

    lo_bound, x0 = math.log(DELTA_FLOOR), math.log(unit_delta)
    g0 = excess(x0)
    if g0 <= 0.0:
        return unit_delta
    if not math.isfinite(g0):
        return None
    best: float | None = None
    x1 = max(lo_bound, x0 - g0 - 0.01)
    for _ in range(12):
        g1 = excess(x1)
        if not math.isfinite(g1):
            return best
        if g1 <= 0.0:
            best = max(best or 0.0, math.exp(x1))
            if g1 > -0.1:
                return best
        slope = (g1 - g0) / (x1 - x0) if x1 != x0 else 1.0
        x0, g0 = x1, g1
        x1 = max(lo_bound, x1 - g1 / max(slope, 0.1) - 0.01)
        if x1 == x0:
            return best
    return best


@lru_cache(maxsize=64)
def _coupled(unit_epsilon: float, unit_delta: float, k: int, m: int, mechanism: str,
             calibration: str) -> tuple[float, float] | None:
    """The per-event (eps, delta) the coupling certifies with the smallest error proxy:
    eps on a geometric grid (7 points) from the basic eps / 2 to the unit epsilon, refined
    by golden section (4 steps) around the best point; for each, the largest certified
    delta. None if no point of the grid is certified. Any certified point is private: the
    search only chooses accuracy."""
    basic = _basic(unit_epsilon, unit_delta, k, m).event_epsilon

    def cost(log_e: float) -> tuple[float, float, float]:
        e = math.exp(log_e)
        d = _largest_delta(e, unit_epsilon, unit_delta, k, m, mechanism, calibration)
        if d is None:
            return math.inf, e, 0.0
        return tight.error_proxy(plan_for(mechanism, calibration, e, d)), e, d

    lo, hi = math.log(basic / 2.0), math.log(unit_epsilon)
    grid = [lo + (hi - lo) * i / 6 for i in range(7)]
    costs = [cost(x) for x in grid]
    i = min(range(len(grid)), key=lambda j: costs[j][0])
    if not math.isfinite(costs[i][0]):
        return None
    best = costs[i]
    a, c = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = c - phi * (c - a), a + phi * (c - a)
    f1, f2 = cost(x1), cost(x2)
    for _ in range(4):
        if f1[0] <= f2[0]:
            c, x2, f2 = x2, x1, f1
            x1 = c - phi * (c - a)
            f1 = cost(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + phi * (c - a)
            f2 = cost(x2)
    best = min((best, f1, f2), key=lambda t: t[0])
    return best[1], best[2]


def _coupled_parameters(basic: UnitParameters, mechanism: str, calibration: str,
                        eps: float, delta: float) -> UnitParameters:
    """UnitParameters of a pair the coupling certified, every guarantee recomputed."""
    k, m = basic.max_events_per_counter, basic.max_counters_per_unit
    plan = plan_for(mechanism, calibration, eps, delta)
    whole = group_account(plan, k, m, basic.unit_epsilon)
    if not whole.delta_total <= basic.unit_delta:  # pragma: no cover - searched so
        raise InvalidParameterError("unit target: could not certify the coupled delta")
    one = group_account(plan, k, 1, basic.unit_epsilon / m)
    return replace(basic, event_epsilon=eps, event_delta=delta,
                   counter_epsilon=basic.unit_epsilon / m,
                   counter_delta=min(1.0, one.delta_total),
                   delivered_epsilon=whole.eps_total, delivered_delta=whole.delta_total,
                   method=METHOD_COUPLED)
