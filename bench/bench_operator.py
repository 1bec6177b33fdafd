"""Throughput of Operator.apply with an in-memory DictStore (no Kafka).

Three workloads, each a timeline of events and "sealed through" markers (one marker per
tick, as the leader's timer writes them):

- dense:   a few counters, several events per counter per tick;
- sparse:  10,000 declared counters, a few events per tick spread over them;
- idle:    10,000 declared counters, markers only (after the first marker created them);
- heartbeat: the same, but every counter's heartbeat falls on the last marker (all due).

Heartbeats are switched off (heartbeat_ticks = 10^6) except in the last workload, so the
first three measure events and markers alone.

Prints records/s per workload and mechanism. Usage:

    .venv/bin/python bench/bench_operator.py [--mechanism ecc simecc] [--ticks 200]
        [--counters 10000] [--cache-size 4096]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterator

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.config import Settings, with_overrides
from processor.stream.operator import DictStore, Operator
from processor.stream.records import encode_event, encode_marker

TICK = 1000


def dense(ticks: int, counters: int, per_tick: int, rng: random.Random) -> Iterator[bytes]:
    for n in range(1, ticks + 1):
        for c in range(counters):
            for _ in range(per_tick):
                yield encode_event(f"k{c:05d}", n * TICK + rng.randrange(TICK), UNIT)
        yield encode_marker(n)


def sparse(ticks: int, counters: int, per_tick: int, rng: random.Random) -> Iterator[bytes]:
    for n in range(1, ticks + 1):
        for _ in range(per_tick):
            c = rng.randrange(counters)
            yield encode_event(f"k{c:05d}", n * TICK + rng.randrange(TICK), UNIT)
        yield encode_marker(n)


def idle(ticks: int) -> Iterator[bytes]:
    for n in range(1, ticks + 1):
        yield encode_marker(n)


def run(settings: Settings, records: list[bytes], warm: list[bytes],
        cache_size: int = 4096) -> tuple[float, int, float]:
    """Apply `warm` (untimed: the first marker creates every counter), then `records`
    (timed). Returns (records/s, releases, counters touched per marker)."""
    op = Operator(settings, NoiseKey.from_seed(1), cache_size=cache_size)
    store = DictStore()
    off = 0
    for r in warm:
        op.apply(store, 0, off, r)
        off += 1
    releases = touched = markers = 0
    t0 = time.perf_counter()
    for r in records:
        out = op.apply(store, 0, off, r)
        off += 1
        releases += len(out.releases)
        if out.metrics["markers_applied"]:
            markers += 1
            touched += out.metrics["counters_touched"]
    dt = time.perf_counter() - t0
    return len(records) / dt, releases, touched / max(markers, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", nargs="+", default=["ecc", "simecc"])
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--counters", type=int, default=10_000)
    ap.add_argument("--cache-size", type=int, default=4096,
                    help="Operator's decoded-state LRU size (its default: 4096)")
    args = ap.parse_args()
    rng = random.Random(0)
    print(f"{'workload':<34} {'mechanism':<8} {'records':>8} {'records/s':>11} "
          f"{'ms/record':>10} {'releases':>9} {'touched/marker':>15}")
    for mech in args.mechanism:
        few = {f"k{c:05d}": 0 for c in range(10)}
        many = {f"k{c:05d}": 0 for c in range(args.counters)}
        base = with_overrides(Settings(), counters=few, partitions=1, mechanism=mech,
                              epsilon=1.0, delta=1e-6, heartbeat_ticks=10**6)
        big = with_overrides(base, counters=many)
        beat = with_overrides(big, heartbeat_ticks=args.ticks + 1)
        cases = [
            ("dense (10 counters x 5 ev/tick)", base,
             list(dense(args.ticks, 10, 5, rng)), [encode_marker(0)]),
            (f"sparse ({args.counters} ctrs, 20 ev/tick)", big,
             list(sparse(args.ticks, args.counters, 20, rng)), [encode_marker(0)]),
            (f"idle markers ({args.counters} ctrs)", big,
             list(idle(args.ticks)), [encode_marker(0)]),
            (f"heartbeat marker ({args.counters} due)", beat,
             list(idle(args.ticks))[-1:], [encode_marker(0), *list(idle(args.ticks))[:-1]]),
        ]
        for name, s, recs, warm in cases:
            rate, rel, touched = run(s, recs, warm, args.cache_size)
            print(f"{name:<34} {mech:<8} {len(recs):>8} {rate:>11,.0f} {1e3 / rate:>10.3f} "
                  f"{rel:>9} {touched:>15.1f}")


if __name__ == "__main__":
    main()
