"""`python -m processor plan`: what an operator should expect before deploying.

For each stream mechanism (ECC, SimECC) and calibration (paper, tight) at the given epsilon,
delta, tick length and event rate: the expected error (RMSE, in events) at a few moments,
the public 95% error bound SimECC publishes there, the time to the first change of the
released count and the typical time between changes. Up to SIM_TICKS ticks these come from
a quick run of the vectorised simulator (processor/simulator: the core's distributions,
32 runs on Bernoulli input, the stream's base); beyond, from the closed forms below, built
on the core's own constants. Seconds in all; tests/test_plan.py checks the closed forms
against the simulator.

The model. One tick carries at most one event: with rate R events/s and ticks of MS ms, an
event falls in a tick with probability p = min(1, R MS / 1000) (a warning says when the
rate saturates the ticks). A checkpoint closes a block every g ticks: SimECC's g_l = mu +
ceil(4 ln l / eps_p) (data-independent); ECC's block ends once its p g events pass Part's
threshold tau_l + (8 / eps_p) ln(g + ceil(12 / eps_p)) under the SVT's noise, which
makes it fire well before (a quick simulation of Part's SVT, 128 runs:
simulator/svt_block.py). Block l's value is released
D_l = a_l + N(0, sigma'_l^2) ticks later (BCC's shift a_l and noise), with CC noise of sd
sigma_l. At a tick whose last released checkpoint is A + D ticks old (A uniform on the
block), the error is e - (events in those ticks), so
    E[err^2] = sigma^2 + p^2 E[(A + D)^2] + p (1 - p) E[A + D],
and before the first release it is the count itself, (p t)^2 + p (1 - p) t.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
import orjson

from processor.commandline import CommandParser
from processor.core.bounds import simecc_bound
from processor.core.cc import DEFAULT_BASE, bcc_offset, cc_sigma
from processor.core.ecc import ecc_parameters, simecc_parameters
from processor.core.errors import CoreError
from processor.core.grid import UNIT
from processor.core.partition import part_tau
from processor.core.tight import CALIBRATIONS
from processor.core.unit import derive
from processor.errors import print_error
from processor.simulator.svt_block import block_steps

MECHANISMS = ("ecc", "simecc")
#: Default moments (seconds): a minute, an hour, a day, a week.
DEFAULT_HORIZONS = (60.0, 3600.0, 86400.0, 604800.0)
BETA = 0.05


@dataclass(frozen=True)
class Row:
    """One mechanism and calibration: times in seconds, errors in events."""

    mechanism: str
    calibration: str
    first_change_s: float
    between_changes_s: float
    #: (seconds, expected RMSE, SimECC's published 95% bound or None)
    error: list[tuple[float, float, float | None]]


@dataclass(frozen=True)
class _Model:
    """The per-block quantities of one mechanism and calibration."""

    mechanism: str
    eps_part: float
    part: float  # mu (SimECC) or tau (ECC)
    cc: tuple[float, float]
    bcc: tuple[float, float]

    def block(self, l: int, p: float) -> float:  # noqa: E741
        """Expected length (ticks) of block l at event probability p (inf: never closes)."""
        if self.mechanism == "simecc":
            return self.part + math.ceil(4.0 * math.log(l) / self.eps_part)
        if p <= 0.0:
            return math.inf
        # tau_l grows like ln l: simulate at l = 1, 2, 4, ... and interpolate in ln l
        lo = 1 << (l.bit_length() - 1)
        a = _svt_block(self.eps_part, part_tau(self.part, lo, self.eps_part), p)
        if lo == l:
            return a
        b = _svt_block(self.eps_part, part_tau(self.part, 2 * lo, self.eps_part), p)
        return a + (b - a) * math.log(l / lo) / math.log(2.0)

    def delay(self, l: int) -> tuple[float, float]:  # noqa: E741
        """(mean, sd) of BCC's release delay for checkpoint l, ticks (ceil adds a half)."""
        a = bcc_offset(self.bcc[0], self.bcc[1], l, DEFAULT_BASE, UNIT) / UNIT
        s = cc_sigma(self.bcc[0], self.bcc[1] / 2, l, DEFAULT_BASE, UNIT) / UNIT
        return a + 0.5, s

    def rmse(self, t: int, p: float) -> float:
        """Expected RMSE of y_t (the module docstring's model)."""
        elapsed, l = 0.0, 0  # noqa: E741
        while True:
            g = self.block(l + 1, p)
            if elapsed + g > t or not math.isfinite(g):
                break
            elapsed += g
            l += 1  # noqa: E741
        first_release = self.block(1, p) + self.delay(1)[0]
        if l == 0 or t < first_release:
            return math.sqrt((p * t) ** 2 + p * (1.0 - p) * t)
        g = self.block(l + 1, p)
        g = min(g, float(t))
        mean_d, sd_d = self.delay(l)
        e_lag = g / 2.0 + mean_d
        e_lag2 = g * g / 3.0 + g * mean_d + mean_d * mean_d + sd_d * sd_d
        sig = cc_sigma(self.cc[0], self.cc[1], l, DEFAULT_BASE, UNIT) / UNIT
        return math.sqrt(sig * sig + p * p * e_lag2 + p * (1.0 - p) * e_lag)


@lru_cache(maxsize=1024)
def _svt_block(eps_p: float, tau_l: float, p: float, runs: int = 128) -> float:
    """Mean number of ticks until Part's SVT instance with threshold tau_l fires on events
    of probability p per tick: a quick simulation (fixed seed, `simulator.svt_block`) of
    Algorithm 1 with the core's noise scales and threshold growth, because the per-step
    noise makes it fire well before tau_l / p."""
    return float(np.mean(block_steps(eps_p, tau_l, p, runs, np.random.default_rng(20240))))


def _model(mechanism: str, eps: float, delta: float, calibration: str) -> _Model:
    if mechanism == "simecc":
        s = simecc_parameters(eps, delta, calibration)
        return _Model("simecc", s.eps_part, float(s.mu), (s.cc_eps, s.cc_delta),
                      (s.bcc_eps, s.bcc_delta))
    e = ecc_parameters(eps, delta, calibration)
    return _Model("ecc", e.eps_part, e.tau, (e.cc_eps, e.cc_delta), (e.bcc_eps, e.bcc_delta))


#: Moments up to this many ticks come from the vectorised simulator (SIM_RUNS runs of
#: Bernoulli(p) input); later ones from the closed form, whose steady state they reach.
SIM_TICKS = 20_000
SIM_RUNS = 32


def _simulated(mech: str, eps: float, delta: float, cal: str, p: float, ticks: int
               ) -> tuple[np.ndarray, float | None, float | None]:
    """(per-tick RMSE, median first change, median time between changes), in ticks, from
    the vectorised simulator (processor/simulator) on the stream's base."""
    from processor.simulator.simulate import simulate

    rng = np.random.default_rng(1729)
    x = (rng.random((SIM_RUNS, ticks)) < p).astype(np.int8)
    y = simulate(mech, x, eps, delta, rng, DEFAULT_BASE, cal)
    moved = np.diff(y, axis=1, prepend=0.0) != 0
    err = y - np.cumsum(x, axis=1)
    rmse = np.sqrt(np.mean(err * err, axis=0))
    firsts = [int(np.argmax(r)) + 1 for r in moved if r.any()]
    first = float(np.median(firsts)) if len(firsts) * 2 > SIM_RUNS else None
    gaps = [float(np.median(np.diff(np.flatnonzero(r)))) for r in moved[:, ticks // 2:]
            if np.count_nonzero(r) >= 3]
    between = float(np.median(gaps)) if len(gaps) * 2 > SIM_RUNS else None
    return rmse, first, between


def plan(eps: float, delta: float, tick_ms: float, rate: float,
         horizons: Sequence[float] = DEFAULT_HORIZONS,
         per_row: Callable[[str, str], tuple[float, float]] | None = None,
         ) -> tuple[float, list[Row]]:
    """(p, rows): the event probability per tick and one Row per mechanism and calibration,
    each at (eps, delta), or at per_row(mechanism, calibration) when given."""
    p = min(1.0, rate * tick_ms / 1000.0)
    sec = tick_ms / 1000.0
    ticks = [max(1, round(h / sec)) for h in horizons]
    rows = []
    for mech in MECHANISMS:
        for cal in CALIBRATIONS:
            eps, delta = (eps, delta) if per_row is None else per_row(mech, cal)
            m = _model(mech, eps, delta, cal)
            rmse, first, between = _simulated(mech, eps, delta, cal, p,
                                              min(SIM_TICKS, max(ticks)))
            if first is None:
                first = m.block(1, p) + m.delay(1)[0]
            if between is None:
                end, elapsed, l = max(ticks), 0.0, 1  # noqa: E741
                while math.isfinite(m.block(l, p)) and elapsed + m.block(l, p) <= end:
                    elapsed += m.block(l, p)
                    l += 1  # noqa: E741
                between = m.block(l, p)
            errors: list[tuple[float, float, float | None]] = []
            for h, t in zip(horizons, ticks, strict=True):
                bound = simecc_bound(eps, delta, BETA, t, DEFAULT_BASE, cal) \
                    if mech == "simecc" else None
                e = float(rmse[t - 1]) if t <= rmse.size else m.rmse(t, p)
                errors.append((h, e, bound))
            rows.append(Row(mech, cal, first * sec, between * sec, errors))
    return p, rows


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


def _parse_duration(text: str) -> float:
    """Seconds from 90, 90s, 15min, 2h, 1d or 1w."""
    units = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0}
    for suffix, size in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * size
    return float(text)


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="python -m processor plan",
        description="Expected error, time to the first change and time between changes of "
        "each stream mechanism and calibration, before deploying (closed forms and quick "
        "simulations, a few seconds; with a per-unit target the tight derivations take a "
        "few seconds more).")
    p.add_argument("--epsilon", type=float, help="privacy parameter epsilon (per event)")
    p.add_argument("--delta", type=float, help="privacy parameter delta (per event)")
    unit = p.add_argument_group(
        "privacy_unit = user (docs/privacy-unit.md): the target per unit and the bounds, "
        "instead of --epsilon/--delta; the per-event parameters are derived, and the "
        "table's error is compared with a per-event deployment at the unit's target")
    unit.add_argument("--unit-epsilon", type=float, help="epsilon per unit")
    unit.add_argument("--unit-delta", type=float, help="delta per unit")
    unit.add_argument("--max-events-per-counter", type=int, help="k")
    unit.add_argument("--max-counters-per-unit", type=int, help="m")
    p.add_argument("--tick-ms", type=float, required=True, help="tick length in ms")
    p.add_argument("--rate", type=float, required=True, help="events per second")
    p.add_argument("--horizon", nargs="+", type=_parse_duration, default=None,
                   help="moments to report the error at: 90, 90s, 15min, 2h, 1d, 1w "
                        "(default: 1min 1h 1d 1w)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    return p


def main_plan(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m processor plan`; returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    if not (args.tick_ms > 0 and args.rate >= 0 and math.isfinite(args.rate)):
        print_error("--tick-ms must be > 0 and --rate >= 0")
        return 2
    horizons = tuple(args.horizon or DEFAULT_HORIZONS)
    if any(not h > 0 for h in horizons):
        print_error("every --horizon must be > 0")
        return 2
    unit_args = (args.unit_epsilon, args.unit_delta, args.max_events_per_counter,
                 args.max_counters_per_unit)
    user = any(a is not None for a in unit_args)
    if user == (args.epsilon is not None or args.delta is not None) or (
            not user and (args.epsilon is None or args.delta is None)) or (
            user and any(a is None for a in unit_args)):
        print_error("give --epsilon and --delta, or all four of --unit-epsilon, "
                    "--unit-delta, --max-events-per-counter and --max-counters-per-unit")
        return 2
    start = time.perf_counter()
    try:
        # The derivation valid for every mechanism, then each row's own: ECC and SimECC
        # may use the k-edit coupling (docs/privacy-unit.md), which depends on both.
        derived = derive(*unit_args) if user else None
        rows_derived = {} if derived is None else {
            (mech, cal): derive(*unit_args, mechanism=mech, calibration=cal)
            for mech in MECHANISMS for cal in CALIBRATIONS}
        if derived is not None:
            args.epsilon, args.delta = derived.event_epsilon, derived.event_delta
        p, rows = plan(args.epsilon, args.delta, args.tick_ms, args.rate, horizons,
                       None if derived is None else (
                           lambda mech, cal: (rows_derived[mech, cal].event_epsilon,
                                              rows_derived[mech, cal].event_delta)))
        # The cost of the bounds: the same target spent per event (k = m = 1).
        ref = (None if derived is None else
               plan(derived.unit_epsilon, derived.unit_delta, args.tick_ms, args.rate,
                    horizons)[1])
    except CoreError as exc:
        print_error(str(exc))
        return 2
    saturated = args.rate * args.tick_ms / 1000.0 > 1.0
    if args.json:
        doc = {"epsilon": args.epsilon, "delta": args.delta, "tick_ms": args.tick_ms,
               "rate": args.rate, "p_event_per_tick": p, "saturated": saturated,
               "beta": BETA, "rows": [asdict(r) for r in rows]}
        if derived is not None and ref is not None:
            doc["unit"] = {**derived.as_record(),
                           "per_row": [rows_derived[r.mechanism, r.calibration].as_record()
                                       for r in rows],
                           "rows_at_unit_target_per_event": [asdict(r) for r in ref]}
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return 0
    if derived is not None:
        print(f"privacy unit: epsilon {derived.unit_epsilon:g}, delta "
              f"{derived.unit_delta:g} per unit, at most {derived.max_events_per_counter} "
              f"events per counter and {derived.max_counters_per_unit} counters per unit "
              f"-> per event (derived, {derived.method}; rows below: their own):")
    print(f"epsilon {args.epsilon:g}, delta {args.delta:g}, ticks of {args.tick_ms:g} ms, "
          f"{args.rate:g} events/s: an event in {p:.3g} of the ticks")
    if saturated:
        print("warning: more than one event per tick on average; a tick counts at most one "
              "event, so shorten the ticks")
    head = "".join(f"{'RMSE@' + _duration(h):>16s}" for h in horizons)
    print(f"{'mechanism':10s}{'calibration':12s}{'first change':>14s}{'between':>10s}{head}")
    for r in rows:
        # A space before each cell: a wide one (a bound of millions) stays apart.
        cells = "".join(" " + f"{e:9.1f} ({'-' if b is None else f'{b:.0f}'})".rjust(15)
                        for _, e, b in r.error)
        print(f"{r.mechanism:10s}{r.calibration:12s}{_duration(r.first_change_s):>14s}"
              f"{_duration(r.between_changes_s):>10s}{cells}")
    print(f"RMSE in events (simulated up to {SIM_TICKS} ticks, closed form beyond); in "
          f"parentheses SimECC's published bound, which holds with probability >= "
          f"{1 - BETA:g} at each tick. ({time.perf_counter() - start:.1f} s)")
    if rows_derived:
        print("per-event parameters of each row (derived from the unit target):")
        for r in rows:
            d = rows_derived[r.mechanism, r.calibration]
            print(f"{r.mechanism:10s}{r.calibration:12s}epsilon {d.event_epsilon:.4g}, "
                  f"delta {d.event_delta:.3g} ({d.method})")
    if ref is not None:
        print("error cost of the bounds (RMSE / RMSE of a per-event deployment at the "
              "unit's target):")
        for r, r0 in zip(rows, ref, strict=True):
            cells = "".join(f"{'x' + format(e / e0, '.2f') if e0 > 0 else '-':>16s}"
                            for (_, e, _), (_, e0, _) in zip(r.error, r0.error, strict=True))
            print(f"{r.mechanism:10s}{r.calibration:12s}{'':24s}{cells}")
    return 0
