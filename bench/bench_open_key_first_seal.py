"""What a new key of an open family costs when first seen late (docs/open-keys.md).

    .venv/bin/python bench/bench_open_key_first_seal.py --keys 20 --age 1000000 [--clock cpu]

Through the operator (pure, an in-memory store): a family starting at tick 0, a marker
through tick AGE - 1, then one event for each of KEYS new keys at tick AGE and the marker
through AGE: that marker's time per key (its first seal: the key's counter's exact skip
from the family's start, its records set aside for the gate). Beside it, the core's
`skip(AGE - 1)` of one counter alone and how many changes it reports. Prints one line per
(mechanism, epsilon); noise key NoiseKey.from_seed(3). `--clock cpu` times both in this
process's CPU time instead of wall time (a machine shared with other work).
"""

from __future__ import annotations

import argparse
import time

from processor.core import registry
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.families import OpenFamily
from processor.stream.model.operator import Operator
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore

CASES = (("simecc", 1.0), ("simecc", 10.0), ("ecc", 1.0), ("ecc", 10.0))
KEY = NoiseKey.from_seed(3)
#: The clock both figures read (main sets it from --clock).
clock = time.perf_counter


def _apply(op: Operator, store: DictStore, offset: int, record: bytes) -> None:
    txn = op.transaction(store)
    op.apply(txn, 0, offset, record)
    op.stage_deferred(txn, 0)
    store.write_many(txn.prepare())
    txn.complete()


def first_seal_ms(mechanism: str, eps: float, keys: int, age: int) -> float:
    """The marker's time per new key (ms)."""
    s = with_overrides(Settings(), partitions=1, tick_ms=1000, heartbeat_ticks=60,
                       mechanism=mechanism, epsilon=eps, delta=1e-6,
                       families={"pages": OpenFamily(0, 1e-7)})
    op, store = Operator(s, KEY), DictStore()
    _apply(op, store, 0, encode_marker(age - 1))
    events = [Event(f"pages[k{i}]", age * 1000 + i, UNIT, 0, i) for i in range(keys)]
    _apply(op, store, 1, encode_batch(events))
    t0 = clock()
    _apply(op, store, 2, encode_marker(age))
    return (clock() - t0) / keys * 1000


def core_skip(mechanism: str, eps: float, age: int) -> tuple[float, int]:
    """One counter's skip(age - 1): (ms, changes reported)."""
    c = registry.make(mechanism, eps, 1e-6, KEY, "bench")
    t0 = clock()
    changes = c.skip(age - 1)
    return (clock() - t0) * 1000, len(changes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=20)
    p.add_argument("--age", type=int, default=1_000_000)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = p.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for mechanism, eps in CASES:
        per_key = first_seal_ms(mechanism, eps, args.keys, args.age)
        skip_ms, changes = core_skip(mechanism, eps, args.age)
        print(f"{mechanism} eps={eps:g}: first seal {per_key:.1f} ms per key at tick "
              f"{args.age:,}; core skip {skip_ms:.1f} ms, {changes:,} changes")


if __name__ == "__main__":
    main()
