"""Private admission of the keys of an open key set (docs/open-keys.md has the proof).

Each key runs an ECC or SimECC as if it had been declared at the deployment's start (the
ticks before its first event are one exact `skip`; the noise is keyed by the key's name).
The key is *admitted* at the first tick t at or after its first event at which its release
exceeds the gate's threshold,

    y_t > A(t) = ceil(sigma_max(t) sqrt(2 ln(t (t + 1) / delta0))) + 2 units,

sigma_max(t) the largest standard deviation of the key's CC noise at any step l <= t
(`cc_sigma_max`): CC's release at its l-th checkpoint is s(t_l) + e_l, and e_l is a sum of
independent discrete Gaussians and of a Gaussian plus a rounding below one unit, so
P(e_l > h) <= exp(-(h - 1 unit)^2 / (2 sigma_l^2)); with the failure schedule
delta_l = delta0 / (l (l + 1)) (summing to delta0 exactly) a key without events is ever
admitted with probability at most delta0, and y_t - A(t) is a lower confidence bound of
the key's count that holds at every tick at once with probability >= 1 - delta0. From its
admission on the key publishes every release (its whole running count: the counter counted
from the deployment's start). What one unit's events can do to the published output is
bounded by `selection_delta`: delta_release + (1 + e^eps) m delta0.

OpenKey is the step operator: update(x) / skip(n) as a counter, returning the published
(tick, value) records; to_bytes / from_bytes a versioned state; restore and continue ==
never stopping. `replay` rebuilds a key's counter from its inputs alone (the stream
stores a waiting key's counter that way: docs/open-keys.md). Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final, Self

from processor.core.api import Change, check_skip
from processor.core.cc import cc_sigma_max
from processor.core.ecc import ECC, SimECC
from processor.core.errors import (
    InvalidInputError,
    InvalidParameterError,
    StateFormatError,
    StateParameterError,
)
from processor.core.grid import UNIT, check_units
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.rng import NoiseKey
from processor.core.state import pack_owned, peek_mechanism, unpack

__all__ = ["GATE_BASES", "OpenKey", "admission_threshold", "failure_share", "gate_delta0",
           "replay", "schedule_sum", "selection_delta"]

#: The CC bases whose noise the threshold's tail bound covers: sums of discrete Gaussians
#: (tree) and of discrete Gaussians with one rounded Gaussian whose roundings stay below one
#: unit (blt). The square-root base rounds per release in a way not bounded here.
GATE_BASES: Final = ("blt", "tree")
#: Units added to the Gaussian tail: one for the BLT's roundings (below 2^-20 + 1/2 unit),
#: one for the float evaluation of the square root and the logarithms.
_SLACK_UNITS: Final = 2

_NAME: Final = "open-key"
_VERSION: Final = 1
_MECHANISMS: Final[dict[str, type[ECC] | type[SimECC]]] = {"ecc": ECC, "simecc": SimECC}


def failure_share(delta0: Fraction, l: int) -> Fraction:  # noqa: E741
    """delta_l = delta0 / (l (l + 1)): the failure the threshold allows CC's l-th release."""
    if l < 1:
        raise InvalidParameterError("checkpoint index must be >= 1")
    return delta0 / (l * (l + 1))


def schedule_sum(delta0: Fraction, n: int) -> Fraction:
    """sum_{l <= n} delta_l = delta0 (1 - 1/(n + 1)) exactly (a telescoping sum): every
    partial sum is below delta0, so the whole schedule is at most delta0."""
    return delta0 * (1 - Fraction(1, n + 1))


def _check_delta0(delta0: object) -> float:
    if isinstance(delta0, bool) or not isinstance(delta0, int | float) or not (
            0.0 < float(delta0) < 1.0):
        raise InvalidParameterError("the gate's failure delta0 must be in (0, 1)")
    return float(delta0)


@lru_cache(maxsize=65536)
def admission_threshold(cc_eps: float, cc_delta: float, base: str, t: int,
                        delta0: float) -> int:
    """A(t) in units (module docstring); non-decreasing in t. At index l <= t the bound
    sigma_l sqrt(2 ln(1/delta_l)) + 1 unit is at most A(t): sigma_l <= sigma_max(t) and
    l (l + 1) <= t (t + 1). The l-th release of CC is shown no earlier than tick l (one
    checkpoint per tick at most), so every release shown by tick t has an index <= t."""
    if base not in GATE_BASES:
        raise InvalidParameterError(
            f"the admission gate covers the bases {', '.join(GATE_BASES)}, not {base!r}")
    if t <= 0:
        return 0
    sd = cc_sigma_max(cc_eps, cc_delta, t, base, UNIT)
    log_over = math.log(t) + math.log(t + 1) - math.log(delta0)
    return math.ceil(sd * math.sqrt(2.0 * log_over)) + _SLACK_UNITS


def _selection_factor(eps: float, keys: int) -> float:
    """(1 + e^eps) keys: what the gate's delta0 costs in the total delta."""
    if keys < 1:
        raise InvalidParameterError("keys per unit must be >= 1")
    if not 0.0 < eps <= 700.0:
        raise InvalidParameterError("eps must be in (0, 700] for the selection's accounting")
    return (1.0 + math.exp(eps)) * keys


def selection_delta(eps: float, delta_release: float, delta0: float, keys: int = 1) -> float:
    """The delta of the published output (admissions and releases) for one unit: the
    releases' (eps, delta_release) (per event, or the unit's guarantee over its counters in
    user mode) plus (1 + e^eps) keys delta0, keys = m (1 in event mode). Rounded up."""
    total = math.fsum((delta_release, _selection_factor(eps, keys) * delta0))
    return math.nextafter(total, math.inf)


def gate_delta0(eps: float, delta_sel: float, keys: int = 1) -> float:
    """The largest delta0 (found downwards from the quotient) whose selection term
    (1 + e^eps) keys delta0 is at most delta_sel."""
    if not 0.0 < delta_sel < 1.0:
        raise InvalidParameterError("delta_sel must be in (0, 1)")
    factor = _selection_factor(eps, keys)
    d0 = delta_sel / factor
    while factor * d0 > delta_sel:
        d0 = math.nextafter(d0, 0.0)
    if d0 <= 0.0:
        raise InvalidParameterError("delta_sel too small for this epsilon")
    return d0


def replay(counter: ECC | SimECC, inputs: Sequence[int], t: int) -> ECC | SimECC:
    """`counter`, fresh (tick 0), stepped through tick `t`: `inputs` is the flat list
    [tick, units, tick, units, ...] of its inputs (ticks strictly increasing, in 1..t),
    every other tick ⊥, the ⊥ runs each one exact `skip`. Its state is then the state of
    the counter stepped tick by tick, or by any other cut of the ⊥ runs into skips, with
    the same inputs (the Counter contract: skip(n) is n ⊥ ticks, and restoring and
    continuing is never stopping): a counter is determined by its noise key, its label,
    its parameters and its inputs. What it costs is the counter's skip over t ticks: the
    checkpoints and releases inside (ECC few without inputs, SimECC one per mu ticks).
    The changes reported inside are dropped: the caller replays a state, publishing
    nothing. InvalidParameterError for a counter already stepped, InvalidInputError for
    inputs out of order or range (nothing is stepped then)."""
    if counter.t != 0:
        raise InvalidParameterError("a replay starts from a fresh counter")
    if len(inputs) % 2 or isinstance(t, bool) or not isinstance(t, int):
        raise InvalidInputError(len(inputs), "inputs are [tick, units] pairs, t an int")
    last = 0
    for i in range(0, len(inputs), 2):
        tick = inputs[i]
        if isinstance(tick, bool) or not isinstance(tick, int) or not last < tick <= t:
            raise InvalidInputError(tick, "input ticks must increase within 1..t")
        check_units(inputs[i + 1])
        last = tick
    for i in range(0, len(inputs), 2):
        counter.skip(inputs[i] - 1 - counter.t)
        counter.update_units(inputs[i + 1])
    counter.skip(t - counter.t)
    return counter


def _cc_plan(counter: ECC | SimECC) -> tuple[float, float]:
    return _cc_plan_of(isinstance(counter, ECC), counter.eps, counter.delta,
                       counter.calibration)


@lru_cache(maxsize=256)
def _cc_plan_of(ecc: bool, eps: float, delta: float, calibration: str) -> tuple[float, float]:
    """CC's (eps, delta) in an ECC (`ecc`) or SimECC of these parameters: a pure function
    of them, computed once (a stream asks it at every seal of a key not admitted)."""
    if ecc:
        p = ecc_parameters(eps, delta, calibration)
        return p.cc_eps, p.cc_delta
    q = simecc_parameters(eps, delta, calibration)
    return q.cc_eps, q.cc_delta


class OpenKey:
    """One key of an open family: its as-if-declared counter and its admission gate.

    Published: nothing before the admission tick; at it the current release; after it
    every change of the release. `admitted` is the admission tick (None: not yet).
    """

    __slots__ = ("_base", "_cc", "admitted", "counter", "delta0", "first")

    def __init__(self, counter: ECC | SimECC, delta0: float, first: int,
                 admitted: int | None = None) -> None:
        if not isinstance(counter, ECC | SimECC):
            raise InvalidParameterError("an open key runs ECC or SimECC")
        self.delta0 = _check_delta0(delta0)
        self._cc = _cc_plan(counter)
        self._base = counter.base
        admission_threshold(*self._cc, self._base, 1, self.delta0)  # the base is covered
        self.counter = counter
        self.first = first
        self.admitted = admitted

    @classmethod
    def first_seen(cls, counter: ECC | SimECC, delta0: float, tick: int) -> Self:
        """The key's counter, fresh, brought to tick - 1 by one exact skip (the ticks before
        the key's first event are ⊥); the caller then steps tick `tick` with the event.
        Releases inside the skip are never published (the key had no event then)."""
        if isinstance(tick, bool) or not isinstance(tick, int) or tick < 1:
            raise InvalidParameterError("the first tick must be an int >= 1")
        if counter.t != 0:
            raise InvalidParameterError("an open key's counter starts at tick 0")
        obj = cls(counter, delta0, tick)
        counter.skip(tick - 1)
        return obj

    def threshold(self, t: int) -> int:
        """A(t) in units for this key's counter."""
        return admission_threshold(*self._cc, self._base, t, self.delta0)

    def observe(self, t: int, y: float, changed: bool) -> list[Change]:
        """The records published at tick t >= first of a counter whose release there is
        y (`changed`: y differs from tick t - 1's); for a caller that steps the counter
        itself (the stream operator) and shows it every tick where y changed."""
        if self.admitted is not None:
            return [(t, y)] if changed else []
        # y is constant between its changes and A never decreases, so the first tick
        # >= first with y_t > A(t) is `first` or a tick where y changed
        if (changed or t == self.first) and round(y * UNIT) > self.threshold(t):
            self.admitted = t
            return [(t, y)]
        return []

    def update(self, x: float | None) -> list[Change]:
        """One tick (the counter validates x first); the records published at it."""
        if self.counter.t + 1 < self.first:
            raise InvalidParameterError("an open key steps from its first tick on")
        before = self.counter.y
        after = self.counter.update(x)
        return self.observe(self.counter.t, after, after != before)

    def skip(self, n: int) -> list[Change]:
        """n ⊥ ticks (exact, the counter's skip); the records published inside them."""
        check_skip(n)
        if n and self.counter.t + 1 < self.first:
            raise InvalidParameterError("an open key steps from its first tick on")
        out: list[Change] = []
        for t, y in self.counter.skip(n):
            out.extend(self.observe(t, y, True))
        return out

    def to_bytes(self) -> bytes:
        st: dict[str, Any] = {"d0": self.delta0, "f": self.first, "a": self.admitted,
                              "c": base64.b64encode(self.counter.to_bytes()).decode("ascii")}
        return pack_owned(_NAME, _VERSION, st)

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey, delta0: float | None = None) -> Self:
        """The key restored from `to_bytes`'s bytes; every field checked before anything
        is built. `delta0`: the gate's delta0 the caller runs the key under; a state
        stored under another is refused (StateParameterError), never continued under a
        gate whose accounting nobody configured."""
        st = unpack(data, _NAME, _VERSION)
        try:
            raw = base64.b64decode(st["c"], validate=True)
            first, admitted, d0 = st["f"], st["a"], st["d0"]
            if not isinstance(first, int) or isinstance(first, bool) or first < 1:
                raise StateFormatError("open key: bad first tick")
            if isinstance(d0, bool) or not isinstance(d0, float) or not 0.0 < d0 < 1.0:
                raise StateFormatError("open key: bad delta0")
            if delta0 is not None and d0 != delta0:
                raise StateParameterError(_NAME, "delta0", d0, delta0)
            counter = _MECHANISMS[peek_mechanism(raw)].from_bytes(raw, key)
            if counter.t < first - 1 or not (
                    admitted is None or (isinstance(admitted, int)
                                         and not isinstance(admitted, bool)
                                         and first <= admitted <= counter.t)):
                raise StateFormatError("open key: ticks out of range")
            return cls(counter, d0, first, admitted)
        except (KeyError, TypeError, ValueError, binascii.Error,
                InvalidParameterError) as exc:
            if isinstance(exc, StateFormatError):
                raise
            raise StateFormatError("open key state is invalid") from None

