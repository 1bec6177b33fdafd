"""The open-key audit (docs/open-keys.md): does a key-admission gate keep its promises?

The gate under test is a black box (`Maker`: a fresh ECC or SimECC, the gate's failure
delta0 and the key's first tick in, a `KeyRun` out, whose update / skip return the
published (tick, value) records); this module never imports the gate's code
(processor/core/selection.py), and its own gates serve only as broken controls. Two
populations of keys, each independently keyed from the audit's seed:

- zero keys: the neighbour's key that one unit's events alone would create, run without
  any event from tick 1 to the horizon (SimECC: at least 400 mu ticks, about 400
  releases). A sound gate admits one with probability at most
  delta0 over the whole horizon, so the number admitted among n is at most
  binom.ppf(1 - alpha, n, delta0) but with probability alpha (check "time-uniform").
- burst keys: first seen at tick `first`, one event per tick for `burst` ticks, then ⊥ to
  tick end = max(horizon, 2 (first + burst)). Check "admission release": the first
  published record of an admitted key is at its admission tick and positive (its count
  passed a positive threshold); deterministic. Check "whole count": the last published
  value is within the mechanism's per-tick error bound at beta of the true count
  (processor/core/bounds.py, a bound on the counter, not on the gate), for all but
  binom.ppf(1 - alpha, admitted, beta) keys; false alarm <= alpha. Check "noisy at
  admission": the value published at admission equals the true count exactly for at most
  binom.ppf(1 - alpha, admitted, p1) keys, p1 = end / (sigma_p sqrt(2 pi)) bounding the
  chance that any of the at most `end` CC releases shown by then hits the true count
  (every release from CC's first complete interval on carries an independent discrete
  Gaussian of sd sigma_p units, whose point masses are at most 1 / (sigma_p sqrt(2 pi)) (1
  + 1e-6)); false alarm <= alpha.

Controls that must FAIL (`CONTROLS`): "per-tick" (the one-release quantile of the noise at
the current tick, no union over releases) and "ignores-k" (user mode: a union over
releases, but at the noise of counters derived for k = 1) are caught by "time-uniform"
under SimECC, whose checkpoints release noise without events; under ECC a key without
events releases nothing (Part does not fire), so the zero keys have nothing to test.
"leaves-out" (publishes from admission on a counter started at admission) is caught by
"admission release", "noiseless" (publishes at admission the exact count of the events
before it, then that plus a counter started at admission) by "noisy at admission".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from scipy.special import ndtri
from scipy.stats import binom

from processor.core.bounds import ecc_bound, simecc_bound
from processor.core.cc import cc_sigma_max, psum_var
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.rng import NoiseKey

Record = tuple[int, float]


class KeyRun(Protocol):
    """One key under a gate: the records it publishes per tick."""

    @property
    def admitted(self) -> int | None: ...

    def update(self, x: float | None) -> list[Record]: ...

    def skip(self, n: int) -> list[Record]: ...


Counter = ECC | SimECC
#: (the key's fresh counter, the gate's delta0, the key's first tick) -> its run, stepped
#: to the tick before the first
Maker = Callable[[Counter, float, int], KeyRun]

CONTROLS: Final = ("per-tick", "ignores-k", "leaves-out", "noiseless")


@dataclass(frozen=True)
class Setup:
    """One configuration the audit runs: counters (mechanism, per-event eps and delta,
    calibration), the gate's delta0 and the populations."""

    mechanism: str
    eps: float
    delta: float
    calibration: str
    delta0: float = 0.2
    zero_keys: int = 60
    burst_keys: int = 40
    first: int = 1000
    horizon: int = 1 << 14
    alpha: float = 1e-3
    beta: float = 0.01
    seed: int = 0

    def counter(self, label: str) -> Counter:
        cls = ECC if self.mechanism == "ecc" else SimECC
        return cls(self.eps, self.delta, NoiseKey.from_seed(self.seed), label,
                   self.calibration)

    def bound(self, t: int) -> float:
        f = ecc_bound if self.mechanism == "ecc" else simecc_bound
        return f(self.eps, self.delta, self.beta, t, "blt", self.calibration)

    def cc_plan(self) -> tuple[float, float]:
        p = (ecc_parameters if self.mechanism == "ecc" else simecc_parameters)(
            self.eps, self.delta, self.calibration)
        return p.cc_eps, p.cc_delta

    def zero_horizon(self) -> int:
        """The zero keys' horizon: `horizon`, or for SimECC long enough for about 400
        checkpoints (mu ticks apart), whatever its parameters."""
        if self.mechanism == "ecc":
            return self.horizon
        return max(self.horizon, 400 * simecc_parameters(
            self.eps, self.delta, self.calibration).mu)

    def burst(self) -> int:
        """Events per burst key: four per-tick error bounds at the horizon and 200 more,
        so that a sound gate admits nearly every key."""
        return math.ceil(4.0 * self.bound(self.horizon)) + 200


@dataclass(frozen=True)
class Finding:
    name: str
    passed: bool
    detail: str
    false_alarm: float


# --------------------------------------------------------------------------- the checks


def _zero_keys(make: Maker, s: Setup) -> Finding:
    admitted = 0
    horizon = s.zero_horizon()
    for i in range(s.zero_keys):
        run = make(s.counter(f"audit/open/zero/{i}"), s.delta0, 1)
        run.update(None)
        run.skip(horizon - 1)
        admitted += run.admitted is not None
    limit = int(binom.ppf(1.0 - s.alpha, s.zero_keys, s.delta0))
    return Finding("time-uniform", admitted <= limit,
                   f"{admitted} of {s.zero_keys} keys without events admitted over "
                   f"{horizon} ticks (at most {limit} at delta0 = {s.delta0})", s.alpha)


def _burst_keys(make: Maker, s: Setup) -> list[Finding]:
    n = s.burst()
    end = max(s.horizon, 2 * (s.first + n))  # room for releases after the burst
    first_ok, admitted, outside, exact = True, 0, 0, 0
    for i in range(s.burst_keys):
        run = make(s.counter(f"audit/open/burst/{i}"), s.delta0, s.first)
        pub: list[Record] = []
        for _ in range(n):
            pub += run.update(1.0)
        pub += run.skip(end - s.first - n + 1)
        a = run.admitted
        if a is None:
            continue
        admitted += 1
        first_ok &= bool(pub) and pub[0][0] == a and pub[0][1] > 0.0
        truth = min(n, a - s.first + 1)
        exact += round(pub[0][1] * UNIT) == truth * UNIT
        outside += abs(pub[-1][1] - n) > s.bound(end)
    if admitted == 0:
        return [Finding("whole count", False, f"none of {s.burst_keys} keys with {n} "
                        "events admitted", 0.0)]
    cc_eps, cc_delta = s.cc_plan()
    sigma_p = math.sqrt(psum_var(cc_eps, cc_delta, "blt", UNIT))
    p1 = min(1.0, end * (1.0 + 1e-6) / (sigma_p * math.sqrt(2.0 * math.pi)))
    lim_out = int(binom.ppf(1.0 - s.alpha, admitted, s.beta))
    lim_exact = int(binom.ppf(1.0 - s.alpha, admitted, p1))
    return [
        Finding("admission release", first_ok, f"{admitted} of {s.burst_keys} keys with {n} "
                "events admitted; first record at the admission tick and positive: "
                f"{first_ok}", 0.0),
        Finding("whole count", outside <= lim_out,
                f"{outside} admitted keys end (tick {end}) further than the per-tick bound "
                f"(beta {s.beta}) from their {n} events (at most {lim_out})", s.alpha),
        Finding("noisy at admission", exact <= lim_exact,
                f"{exact} admitted keys published exactly their count at admission (at "
                f"most {lim_exact})", s.alpha),
    ]


def audit_open_keys(make: Maker, setup: Setup) -> list[Finding]:
    """Every check of the module docstring on one configuration."""
    return [_zero_keys(make, setup), *_burst_keys(make, setup)]


# --------------------------------------------------------------------------- the controls


class _ThresholdGate:
    """A gate of the audit's own (controls only): admits at the first tick >= first at
    which the release exceeds thr(t) units; publishes every change after."""

    def __init__(self, counter: Counter, first: int, thr: Callable[[int], float]) -> None:
        self.counter, self.first, self.thr = counter, first, thr
        self.admitted: int | None = None
        counter.skip(first - 1)

    def _see(self, t: int, y: float, changed: bool) -> list[Record]:
        if self.admitted is not None:
            return [(t, y)] if changed else []
        if (changed or t == self.first) and y * UNIT > self.thr(t):
            self.admitted = t
            return [(t, y)]
        return []

    def update(self, x: float | None) -> list[Record]:
        before = self.counter.y
        y = self.counter.update(x)
        return self._see(self.counter.t, y, y != before)

    def skip(self, n: int) -> list[Record]:
        out: list[Record] = []
        for t, y in self.counter.skip(n):
            out += self._see(t, y, True)
        return out


def per_tick_gate(setup: Setup) -> Maker:
    """Control: the one-release delta0-quantile of the noise at tick t, no union."""
    cc_eps, cc_delta = setup.cc_plan()

    def make(counter: Counter, delta0: float, first: int) -> KeyRun:
        z = float(-ndtri(delta0))
        return _ThresholdGate(counter, first,
                              lambda t: z * cc_sigma_max(cc_eps, cc_delta, t, "blt", UNIT))
    return make


def union_gate(cc_eps: float, cc_delta: float) -> Maker:
    """A union bound over the releases (failure delta0 / (l (l + 1)) at index l) at the
    noise of a CC with (cc_eps, cc_delta): the control "ignores-k" hands it the plan of
    counters derived for k = 1 while the keys' counters are derived for the real k."""
    def make(counter: Counter, delta0: float, first: int) -> KeyRun:
        def thr(t: int) -> float:
            sd = cc_sigma_max(cc_eps, cc_delta, t, "blt", UNIT)
            return sd * math.sqrt(2.0 * math.log(t * (t + 1) / delta0)) + 1.0
        return _ThresholdGate(counter, first, thr)
    return make


class _LateCount:
    """Controls "leaves-out" and "noiseless": the gate under test decides admission, but
    from admission on the published value comes from a counter started at the admission
    tick a (its tick tau is tick a + tau), plus, "noiseless", the exact count of the
    events up to a."""

    def __init__(self, inner: KeyRun, late: Callable[[], Counter], exact: bool,
                 first: int) -> None:
        self.inner, self.late_factory, self.exact = inner, late, exact
        self.late: Counter | None = None
        self.t = first - 1
        self.count = 0.0
        self.base = 0.0

    @property
    def admitted(self) -> int | None:
        return self.inner.admitted

    def _start(self) -> Record:
        self.late = self.late_factory()
        self.base = self.count if self.exact else 0.0
        return (self.t, self.base)

    def update(self, x: float | None) -> list[Record]:
        pub = self.inner.update(x)
        self.t += 1
        self.count += x or 0.0
        if self.late is None:
            return [self._start()] if pub else []
        before = self.late.y
        y = self.late.update(x)
        return [(self.t, self.base + y)] if y != before else []

    def skip(self, n: int) -> list[Record]:
        pub = self.inner.skip(n)
        end = self.t + n
        if self.late is None:
            if not pub:
                self.t = end
                return []
            self.t = pub[0][0]
            out = [self._start()]
        else:
            out = []
        late = self.late
        assert late is not None
        a = self.t - late.t
        out += [(a + tau, self.base + y) for tau, y in late.skip(end - self.t)]
        self.t = end
        return out


def late_count(make: Maker, setup: Setup, exact: bool) -> Maker:
    """Control "leaves-out" (exact False) or "noiseless" (exact True) around the gate under
    test."""
    counter_no = [0]

    def wrapped(counter: Counter, delta0: float, first: int) -> KeyRun:
        counter_no[0] += 1
        label = f"audit/open/late/{counter_no[0]}"
        return _LateCount(make(counter, delta0, first), lambda: setup.counter(label), exact,
                          first)
    return wrapped
