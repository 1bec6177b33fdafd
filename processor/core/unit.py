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
Pure: no I/O, floats only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from processor.core.bounded import check_eps_delta
from processor.core.errors import InvalidParameterError

#: Largest accepted bound (either one): beyond it the derived epsilon is so small that no
#: counter is useful, and the rounding loops below stay short.
MAX_BOUND: Final = 1_000_000

#: The method names a ledger entry carries (`UnitParameters.method`).
METHOD: Final = "group-privacy+basic-composition"


@dataclass(frozen=True)
class UnitParameters:
    """The derived parameters of one deployment in privacy_unit = "user" mode.

    unit_*: the target per unit (what the operator promises a person); event_*: what each
    counter is built with (the guarantee per event); counter_*: what one counter gives one
    unit (k events, group privacy); delivered_*: what the whole release gives one unit,
    recomputed forward from event_* (never above the target)."""

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
           max_counters_per_unit: int) -> UnitParameters:
    """Per-event (eps, delta) of each counter from the target per unit and the bounds.

    Raises InvalidParameterError (naming the parameter) on a bad target or bound, or when
    the derived delta underflows (a target delta too small for the bounds at this eps)."""
    try:
        check_eps_delta(unit_epsilon, unit_delta)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"unit target: {exc}") from None
    k = check_bound("max_events_per_counter", max_events_per_counter)
    m = check_bound("max_counters_per_unit", max_counters_per_unit)
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
