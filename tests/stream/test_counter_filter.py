"""The operator's input duplicate filter is per counter (processor/stream/model/operator.py,
CounterState.inputs): an event is never dropped because of an event of another counter,
a zombie ingest's out-of-order writes included, while re-sent copies of a counter's own
events stay duplicates. Pure: the operator on a dict store.

Fixed seeds, exact properties (no false alarms). Control: a filter shared by the
partition's counters (the broken variant, as the operator had it) fails the same
independence check.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import orjson

from processor.core import registry
from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import encode_batch_rows, source_label
from processor.stream.model.state import COUNTER_PREFIX, PARTITION_PREFIX, CounterState, DictStore
from tests.stream.helpers import apply_now

KEY = NoiseKey.from_seed(5)
TICK = 1000
S = with_overrides(Settings(), partitions=1, tick_ms=TICK, counters={c: 0 for c in "abc"},
                   mechanism="ecc", epsilon=1.0, delta=1e-6)

#: A timeline log of event records: rows [counter, ts_ms, units, input partition,
#: input offset]; an event is told apart by its units (= input offset + 1).
Log = list[list[list[object]]]


def _row(counter: str, in_offset: int) -> list[object]:
    return [counter, 5 * TICK, in_offset + 1, 0, in_offset]


def _applied(log: Log, store: DictStore | None = None, first: int = 100
             ) -> dict[str, set[int]]:
    """counter -> the input offsets of its events the operator applied (its pending
    arrivals), applying `log` in order at timeline offsets from `first`."""
    store = store if store is not None else DictStore()
    op = Operator(S, KEY)
    for off, rows in enumerate(log):
        apply_now(op, store, 0, first + off, encode_batch_rows(rows, "in"), Output())
    return {k[len(COUNTER_PREFIX):]: {u - 1 for u in _pending(store, k)}
            for k in store.data if k.startswith(COUNTER_PREFIX)}


def _pending(store: DictStore, key: str) -> list[int]:
    cs = CounterState.from_bytes(store.data[key], registry, KEY)
    return [u for us in cs.pending.values() for u in us]


def _shared(log: Log) -> dict[str, set[int]]:
    """The broken variant: what a filter shared by the partition's counters applies."""
    hw = -1
    out: dict[str, set[int]] = {}
    for rows in log:
        for c, _, _, _, o in rows:
            assert isinstance(c, str) and isinstance(o, int)
            if o <= hw:
                continue
            hw = o
            out.setdefault(c, set()).add(o)
    return out


def _independent(log: Log, applied: Callable[[Log], dict[str, set[int]]]) -> bool:
    """Whether every counter's applied events are the same with and without any one other
    counter's events in the log."""
    whole = applied(log)
    for c in "abc":
        without = applied([[r for r in rows if r[0] != c] for rows in log])
        if {k: v for k, v in whole.items() if k != c} != {k: v for k, v in without.items()
                                                          if v}:
            return False
    return True


def _zombie_logs() -> list[Log]:
    """Ingest's records in input order, counters at random, and a zombie's write of three
    offsets the live owner skipped (it took over past them), late: after the live
    owner's last batch, which follows them."""
    logs = []
    for seed in range(8):
        rng = random.Random(seed)
        log: Log = []
        nxt = 0
        gap: list[list[object]] = []
        for i in range(5):
            if i == 4:
                gap = [_row(rng.choice("abc"), nxt + j) for j in range(3)]
                nxt += 3
            log.append([_row(rng.choice("abc"), nxt + j) for j in range(rng.randint(1, 2))])
            nxt += len(log[-1])
        log.append(gap)
        logs.append(log)
    return logs


def test_no_event_is_a_duplicate_of_another_counters_event() -> None:
    """A's event at input offset 20, then (a zombie's late write) b's at 10 and a copy of
    a's: b's is applied, a's copy is dropped. Control: the shared filter drops b's."""
    log: Log = [[_row("a", 20)], [_row("b", 10), _row("a", 20)]]
    assert _applied(log) == {"a": {20}, "b": {10}}
    assert _shared(log) == {"a": {20}}


def test_counters_are_independent_under_out_of_order_writes() -> None:
    logs = _zombie_logs()
    assert all(_independent(log, _applied) for log in logs)
    assert not all(_independent(log, _shared) for log in logs)


def _legacy(store: DictStore, floor: int) -> None:
    """Rewrite the store as the operator wrote it while the filter was shared: counter
    values of ten fields (no filter of their own), a partition value of five whose
    filter is {source: floor}."""
    label = source_label("in", 0)
    for k, v in list(store.data.items()):
        if k.startswith(COUNTER_PREFIX):
            n = int.from_bytes(v[20:24], "big")
            meta = orjson.loads(v[24 + n:])
            store.data[k] = v[:24 + n] + orjson.dumps(meta[:10])
        elif k.startswith(PARTITION_PREFIX):
            fields = orjson.loads(v[12:])
            store.data[k] = v[:12] + orjson.dumps([*fields[:3], [[label, floor]], fields[4]])


def test_a_counter_written_before_the_filter_starts_from_the_shared_one() -> None:
    """Upgrade: a counter value without its own filter starts from the partition's shared
    one, so a re-sent copy of an event applied before the upgrade stays a duplicate; a
    counter made after the upgrade has its own from the start. Control: with nothing to
    start from, the copy counts twice."""
    store = DictStore()
    _applied([[_row("a", 20)]], store)
    _legacy(store, 20)
    after = _applied([[_row("a", 15), _row("a", 20), _row("a", 21), _row("b", 15)]], store,
                     first=200)
    assert after == {"a": {20, 21}, "b": {15}}
    assert sorted(_pending(store, COUNTER_PREFIX + "a")) == [21, 22]
    control = DictStore()
    _applied([[_row("a", 20)]], control)
    _legacy(control, -1)
    _applied([[_row("a", 20)]], control, first=200)
    assert _pending(control, COUNTER_PREFIX + "a") == [21, 21]
