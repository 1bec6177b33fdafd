"""What a worker's start check of the ledger costs (worker/app.py `ledger_at_start`).

    .venv/bin/python bench/bench_ledger_start.py --counters 100000 --mode user

A ledger of COUNTERS created entries as a worker writes them (the operator's own entry
for one counter, renamed per counter), read back by a configuration declaring all of
them: CPU seconds of `ledger_at_start` per repeat (process time, so that other load on
the machine counts less). Noise key NoiseKey.from_seed(28).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore
from processor.stream.worker.app import ledger_at_start

KEY = NoiseKey.from_seed(28)


def created_ledger(s: Settings, counters: int) -> list[bytes | None]:
    """`counters` created entries: the one the operator writes for the declared counter
    at its first marker, renamed c000000, c000001, ..."""
    op, store, out = Operator(s, KEY), DictStore(), Output()
    for offset in (1, 2):
        txn = op.transaction(store)
        op.apply(txn, 0, offset, encode_marker(offset), out)
        op.stage_deferred(txn, 0)
        store.write_many(txn.prepare())
        txn.complete()
    entry = out.ledger[0]
    return [dataclasses.replace(entry, counter=f"c{i:06d}").to_json()
            for i in range(counters)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counters", type=int, default=100_000)
    p.add_argument("--mode", choices=("user", "event"), default="user")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    s = with_overrides(Settings(), partitions=1, tick_ms=1000, counters={"c000000": 0},
                       mechanism="ecc", epsilon=4.0, delta=1e-6, heartbeat_ticks=1,
                       heartbeat_spread=False)
    if a.mode == "user":
        s = with_unit(s, 4.0, 1e-6, 3, 2)
    ledger = created_ledger(s, a.counters)
    s = with_overrides(s, counters={f"c{i:06d}": 0 for i in range(a.counters)})
    for _ in range(a.repeats):
        t = time.process_time()
        announced, _claim = ledger_at_start(s, KEY, ledger)
        assert len(announced) == a.counters
        print(f"ledger_at_start {a.counters} counters, {a.mode} mode: "
              f"{time.process_time() - t:.3f} CPU-s")


if __name__ == "__main__":
    main()
