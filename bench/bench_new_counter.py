"""What a new declared counter costs: its creation and its first seal (docs/replay.md "Speed").

    .venv/bin/python bench/bench_new_counter.py [--counters 20000] [--repeats 3]
        [--mechanism ecc] [--epsilon 1]

CPU time of this process (`time.process_time`) per counter, the best of --repeats, with
the garbage collector off while timed (its cost depends on what else the process holds):

  create     `registry.make` of --counters counters (ECC: its SVT's Z_0 draw and the key
             derivation of its lane, CC and BCC set up);
  first seal  on each, `skip(59)`, `next_due()` and `to_bytes()`: the exact skip through
             the first heartbeat (the SVT's dense prefix drawn, the skip lane's plan
             sampled), as a first marker asks it;
  operator   a marker through tick 61 on an `Operator` (pure, a DictStore; 1 s ticks,
             heartbeat every 60 ticks spread over the counters, one partition) whose
             configuration declares --counters counters starting at tick 1: each created,
             announced (its ledger entry), sealed through its first heartbeat and its
             state written, what replay's
             recomputation and a worker's first marker do per declared counter.

Noise key NoiseKey.from_seed(3); counter names c0, c1, ...
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

from processor.core import registry
from processor.core.api import Counter
from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore

KEY = NoiseKey.from_seed(3)


def _cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    finally:
        gc.enable()


def core(mechanism: str, eps: float, n: int, run: int) -> tuple[float, float]:
    """(create, first seal) CPU seconds for n counters (names unique to `run`)."""
    made: list[Counter] = []

    def create() -> None:
        made.extend(registry.make(mechanism, eps, 1e-6, KEY, f"r{run}/c{i}")
                    for i in range(n))

    def seal() -> None:
        for c in made:
            c.skip(59)
            c.next_due()
            c.to_bytes()

    return _cpu(create), _cpu(seal)


def operator(mechanism: str, eps: float, n: int) -> float:
    """CPU seconds of the marker through tick 61 that creates and seals n counters."""
    s = with_overrides(Settings(), counters={f"c{i}": 1000 for i in range(n)}, partitions=1,
                       tick_ms=1000, heartbeat_ticks=60, heartbeat_spread=True,
                       mechanism=mechanism, epsilon=eps, delta=1e-6)
    op, store = Operator(s, KEY), DictStore()

    def marker() -> None:
        txn = op.transaction(store)
        op.apply(txn, 0, 0, encode_marker(61))
        op.stage_deferred(txn, 0)
        store.write_many(txn.prepare())
        txn.complete()

    return _cpu(marker)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counters", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mechanism", default="ecc")
    p.add_argument("--epsilon", type=float, default=1.0)
    args = p.parse_args()
    n = args.counters
    core(args.mechanism, args.epsilon, 100, -1)  # imports, caches
    runs = [core(args.mechanism, args.epsilon, n, r) for r in range(args.repeats)]
    ops = [operator(args.mechanism, args.epsilon, n) for _ in range(args.repeats)]
    create = min(r[0] for r in runs) / n * 1e6
    seal = min(r[1] for r in runs) / n * 1e6
    print(f"{args.mechanism} eps={args.epsilon:g}, {n:,} counters, CPU per counter (best "
          f"of {args.repeats}): create {create:.1f} us, first seal {seal:.1f} us, "
          f"operator's first marker {min(ops) / n * 1e6:.1f} us")


if __name__ == "__main__":
    main()
