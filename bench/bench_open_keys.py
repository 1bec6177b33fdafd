"""What admitting an open key costs (docs/open-keys.md), simulated with the core's OpenKey.

    .venv/bin/python bench/bench_open_keys.py --seeds 100

Event mode at each (eps, delta) of the table: the counters get (eps, delta / 2), the gate
delta0 = gate_delta0(eps, delta / 2) (so the whole output is (eps, delta)). Each key is
first seen at deployment tick AGE (2^20) and keyed by its seed (NoiseKey.from_seed(seed)).

- smallest count admitted with probability 1/2 and 0.99: a key gets n events, one per
  tick, then WINDOW (2^16) ticks without events; per seed, the least n admitted by the end
  is found by bisection (exact for SimECC, whose releases never decrease in n for one seed;
  for ECC, whose partition depends on the data, the bisection's answer); the table gives
  the median and the 99th percentile over the seeds (the 99th: the value below which 99% of
  them lie, nearest rank).
- a steady key: one event per tick (and one per 10 ticks) from AGE on until admission: the
  ticks from the first event to admission and the count then (median and 99th percentile).
Prints a Markdown table; fixed seeds 0..seeds-1.
"""

from __future__ import annotations

import argparse
import math
import time

from processor.core.ecc import ECC, SimECC
from processor.core.rng import NoiseKey
from processor.core.selection import OpenKey, gate_delta0

AGE = 1 << 20
WINDOW = 1 << 16
SETTINGS = ((1.0, 1e-6), (10.0, 1e-6), (6.0, 1e-9))


#: the state of each key brought to tick AGE - 1 (one skip per key, not one per run:
#: restoring and continuing is exactly never stopping)
_FRESH: dict[tuple[str, float, float, str, int], bytes] = {}


def _key(mech: type[ECC] | type[SimECC], eps: float, delta: float, cal: str,
         seed: int) -> OpenKey:
    key = NoiseKey.from_seed(seed)
    at = (mech.mechanism, eps, delta, cal, seed)
    if at not in _FRESH:
        c = mech(eps, delta / 2, key, f"bench/open/{seed}", cal)
        _FRESH[at] = OpenKey.first_seen(c, gate_delta0(eps, delta / 2), AGE).to_bytes()
    return OpenKey.from_bytes(_FRESH[at], key)


def admitted_with(mech: type[ECC] | type[SimECC], eps: float, delta: float, cal: str,
                  seed: int, n: int) -> bool:
    k = _key(mech, eps, delta, cal, seed)
    for _ in range(n):
        k.update(1.0)
        if k.admitted is not None:
            return True
    k.skip(WINDOW)
    return k.admitted is not None


def least_count(mech: type[ECC] | type[SimECC], eps: float, delta: float, cal: str,
                seed: int) -> int:
    hi = 64
    while not admitted_with(mech, eps, delta, cal, seed, hi):
        hi *= 2
    lo = hi // 2 if hi > 64 else 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if admitted_with(mech, eps, delta, cal, seed, mid):
            hi = mid
        else:
            lo = mid
    return hi


def steady(mech: type[ECC] | type[SimECC], eps: float, delta: float, cal: str,
           seed: int, every: int) -> tuple[int, int]:
    """(ticks from the first event to admission, events by then) at one event per
    `every` ticks."""
    k = _key(mech, eps, delta, cal, seed)
    events = 0
    while True:
        k.update(1.0)
        events += 1
        if k.admitted is not None:
            return k.admitted - AGE, events
        if every > 1:
            k.skip(every - 1)
            if k.admitted is not None:
                return k.admitted - AGE, events


def _q(xs: list[int], q: float) -> int:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=100)
    args = p.parse_args()
    seeds = range(args.seeds)
    print("| eps, delta | mechanism | calibration | threshold A(AGE) | n admitted p=0.5 "
          "| p=0.99 | steady 1/tick: ticks to admission (median, p99) | count at admission "
          "| steady 1/10 ticks: ticks (median, p99) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for eps, delta in SETTINGS:
        for mech in (SimECC, ECC):
            for cal in ("paper", "tight"):
                t0 = time.time()
                thr = _key(mech, eps, delta, cal, 0).threshold(AGE) / (1 << 16)
                least = [least_count(mech, eps, delta, cal, s) for s in seeds]
                st1 = [steady(mech, eps, delta, cal, s, 1) for s in seeds]
                st10 = [steady(mech, eps, delta, cal, s, 10) for s in seeds]
                print(f"| {eps:g}, {delta:g} | {mech.mechanism} | {cal} | {thr:.0f} | "
                      f"{_q(least, 0.5)} | {_q(least, 0.99)} | "
                      f"{_q([a for a, _ in st1], 0.5)}, {_q([a for a, _ in st1], 0.99)} | "
                      f"{_q([c for _, c in st1], 0.5)}, {_q([c for _, c in st1], 0.99)} | "
                      f"{_q([a for a, _ in st10], 0.5)}, {_q([a for a, _ in st10], 0.99)} |"
                      f" <!-- {time.time() - t0:.0f} s -->", flush=True)
                _FRESH.clear()


if __name__ == "__main__":
    main()
