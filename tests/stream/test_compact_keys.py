"""The compact stored form of open keys waiting for admission (state.py format 5,
docs/open-keys.md "Keys waiting for admission, in memory and in the store"): its value
replays, byte for byte, to the state the uninterrupted counter has; restoring it at
every record equals never stopping; old values still decode; the monotone rule reads
its offset. Pure: no Kafka. Fixed seeds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from processor.core import registry
from processor.core.errors import StateFormatError
from processor.stream.model import state as state_module
from processor.stream.model.families import key_counter
from processor.stream.model.operator import Operator
from processor.stream.model.provenance import CalibratedRegistry
from processor.stream.model.state import (
    COMPACT_EVENTS,
    CounterState,
    DictStore,
    advance_counter_value,
    counter_filed_due,
    stored_offset,
    supersedes,
)
from tests.stream.test_open_families import _public, _timeline, open_settings
from tests.stream.test_operator import KEY, Run

COMPACT = b"DPC\x05"


def _full(cs: CounterState) -> bytes:
    """`cs` in format 4 (mechanism state included), whatever form it is stored in."""
    trail, cs.trail = cs.trail, None
    try:
        return cs.to_bytes()
    finally:
        cs.trail, cs.saved = trail, None


class KeepsDecoded(Operator):
    """Keeps every counter decoded (never released): the run that never stops."""

    def _keep(self, txn: Any, partition: int, name: str, cs: CounterState, n: int,
              filed: int | None, quiet: bool, idle: bool) -> None:
        super()._keep(txn, partition, name, cs, n, filed, quiet, False)


def _keys(seed: int, n: int, T: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"k{i}": sorted(rng.choices(range(T - 50), k=rng.randint(1, 6)))
            for i in range(n)}


def _mismatches(mechanism: str, calibration: str, seed: int) -> tuple[int, int]:
    """Runs 12 keys with 1 to 6 events (some on one tick: queued) and a heavy key, one
    record at a time, values staying decoded (never stopping); after every record each
    compact stored value is decoded (replayed) and compared, in format 4, with the
    decoded object the run goes on with. Returns (compact values compared, mismatches)."""
    s = open_settings(mechanism=mechanism, calibration=calibration, epsilon=4.0,
                      heartbeat_ticks=7)
    T = 400
    keys = _keys(seed, 12, T)
    keys["heavy"] = list(range(5, T))
    run = Run(s, CalibratedRegistry(calibration))
    run.op = KeepsDecoded(s, KEY, factory=CalibratedRegistry(calibration))
    cached = run.op._cache.section(run.op._counters)
    compared = wrong = 0
    for r in _timeline(keys, T, declared=[3, 9]):
        run.feed(r)
        for k, raw in run.store.data.items():
            if not raw.startswith(COMPACT):
                continue
            live = cached[k]
            if live.saved is not raw:  # ahead of the store (deferred ⊥-only progress)
                continue
            compared += 1
            wrong += _full(CounterState.from_bytes(raw, registry, KEY)) != _full(live)
    return compared, wrong


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_a_compact_value_replays_to_the_uninterrupted_state(
        mechanism: str, calibration: str, monkeypatch: Any) -> None:
    """Every compact value written while 12 keys wait (random events, two seeds) decodes
    to the state, format-4 bytes for bytes (mechanism included), of the counter that was
    never stored. Control: a replay that drops a key's last input is caught."""
    for seed in (1, 2):
        compared, wrong = _mismatches(mechanism, calibration, seed)
        assert compared > 50 and wrong == 0

    real = state_module.replay  # type: ignore[attr-defined]

    def drops_one(counter: Any, inputs: list[int], t: int) -> Any:
        return real(counter, inputs[:-2], t)

    monkeypatch.setattr(state_module, "replay", drops_one)
    compared, wrong = _mismatches(mechanism, calibration, 1)
    assert wrong > 0


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_restoring_compact_keys_at_every_record_equals_never_stopping(mechanism: str) -> None:
    """With no decoded value kept (cache 0: every record replays the keys it touches)
    the public records, marker by marker, and the stored bytes at the end are those of
    the run that keeps them decoded; keys were stored compact."""
    s = open_settings(mechanism=mechanism, epsilon=4.0, heartbeat_ticks=7)
    T = 300
    keys = {**_keys(3, 10, T), "heavy": list(range(5, T))}
    records = _timeline(keys, T, declared=[3, 9])
    assert _public(s, records, cache_size=0) == _public(s, records)
    stores = []
    for size in (0, 4096):
        run = Run(s, registry, cache_size=size)
        for r in records:
            run.feed(r)
        stores.append(run.store.data)
    assert stores[0] == stores[1]
    assert sum(v.startswith(COMPACT) for v in stores[0].values()) >= 8


def test_what_is_stored_compact_and_what_is_not() -> None:
    """A waiting key with up to COMPACT_EVENTS inputs is compact, at most 200 bytes with
    5 events; one with more inputs, an admitted key and a declared counter are format 4
    (a declared counter's value is what it always was: no trail, its fields as before)."""
    s = open_settings()
    T = 700
    keys = {"one": [10], "five": [10, 20, 30, 40, 50],
            "many": list(range(10, 12 + COMPACT_EVENTS)), "heavy": list(range(5, T))}
    run = Run(s, registry)
    for r in _timeline(keys, T, declared=[3]):
        run.feed(r)
    data = run.store.data
    assert key_counter("pages", "heavy") in {e.counter for e in run.ledger}
    one, five = data["c/pages[one]"], data["c/pages[five]"]
    assert one.startswith(COMPACT) and five.startswith(COMPACT) and len(five) <= 200
    for name in ("pages[many]", "pages[heavy]", "declared"):
        assert data[f"c/{name}"].startswith(b"DPC\x04"), name
    declared = CounterState.from_bytes(data["c/declared"], registry, KEY)
    assert declared.trail is None and declared.to_bytes() == data["c/declared"]
    got = CounterState.from_bytes(five, registry, KEY)
    assert got.trail is not None and len(got.trail) == 10 and got.to_bytes() == five
    assert got.admission is not None and got.admission.first == 11


def test_old_values_decode_and_the_header_is_read_without_a_replay() -> None:
    """A waiting key stored in format 4 (before the compact form) decodes, and goes on
    in format 4; a compact value's offset and filed_due are read from its header, and
    the monotone rule orders it against format-4 values of the same key. A compact
    value cut short is refused."""
    s = open_settings(epsilon=4.0)
    run = Run(s, registry)
    for r in _timeline({"k": [10, 12]}, 60):
        run.feed(r)
    raw = run.store.data["c/pages[k]"]
    cs = CounterState.from_bytes(raw, registry, KEY)
    old = _full(cs)
    assert old.startswith(b"DPC\x04") and raw.startswith(COMPACT)
    legacy = CounterState.from_bytes(old, registry, KEY)
    assert legacy.trail is None and legacy.to_bytes() == old and _full(legacy) == _full(cs)
    assert stored_offset(raw) == stored_offset(old) == cs.last_offset
    assert counter_filed_due(raw) == counter_filed_due(old) == cs.filed_due
    cs.last_offset += 1
    newer = cs.to_bytes()
    assert supersedes(newer, old) and not supersedes(old, newer)
    assert supersedes(old, raw) and supersedes(raw, old)  # one offset: one state
    for cut in (30, 60, len(raw) - 3):
        with pytest.raises(StateFormatError):
            CounterState.from_bytes(raw[:cut], registry, KEY)
    store = DictStore()
    store.set("c/pages[k]", raw)
    assert store.get("c/pages[k]") == raw


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_a_compact_value_advances_by_quiet_ticks_without_a_replay(mechanism: str) -> None:
    """`advance_counter_value` on a compact value (what a marker writes for a released
    waiting key at the deferral bound) gives the bytes of the key decoded, sealed by the
    same ⊥ ticks short of its next due tick and encoded; it refuses a value with events
    pending and a frontier that goes back."""
    s = open_settings(mechanism=mechanism, epsilon=4.0)
    run = Run(s, registry)
    keys = _keys(6, 8, 200)
    for r in _timeline(keys, 200):
        run.feed(r)
    checked = 0
    for raw in run.store.data.values():
        if not raw.startswith(COMPACT):
            continue
        cs = CounterState.from_bytes(raw, registry, KEY)
        nd = cs.mechanism.next_due()
        k_ticks = 40 if nd is None else nd - cs.mechanism.t - 1
        if k_ticks <= 0:
            continue
        frontier = cs.frontier + k_ticks
        got = advance_counter_value(raw, lambda _b, _k: None, frontier, 999, 10**6, 77)
        assert cs.mechanism.skip(k_ticks) == []
        cs.frontier, cs.next_heartbeat, cs.last_offset, cs.filed_due = (
            frontier, 999, 10**6, 77)
        assert got == cs.to_bytes() and got is not None and got.startswith(COMPACT)
        assert advance_counter_value(raw, lambda _b, _k: None, cs.start_tick, 9, 9, 9) is None
        checked += 1
    assert checked >= 6
    pending = Run(s, registry)
    pending.event(key_counter("pages", "p"), 30)
    raw = pending.store.data["c/pages[p]"]
    assert raw.startswith(COMPACT)
    assert advance_counter_value(raw, lambda _b, _k: None, 40, 9, 9, 9) is None
