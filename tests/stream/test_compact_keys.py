"""The compact stored form of open keys waiting for admission (state.py format 5,
docs/open-keys.md "Keys waiting for admission, in memory and in the store"): its value
replays, byte for byte, to the state the uninterrupted counter has; restoring it at
every record equals never stopping; old values still decode; the monotone rule reads
its offset. Pure: no Kafka. Fixed seeds."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from unittest import mock

import pytest

from processor.core import registry
from processor.core.errors import StateFormatError
from processor.stream.model import operator as operator_module
from processor.stream.model import state as state_module
from processor.stream.model.commit import BatchCommit
from processor.stream.model.families import key_counter
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.operator import DEFERRED_HEARTBEATS, Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.provenance import CalibratedRegistry
from processor.stream.model.records import encode_marker
from processor.stream.model.state import (
    COMPACT_EVENTS,
    CounterState,
    DictStore,
    advance_counter_value,
    counter_filed_due,
    stored_offset,
    supersedes,
)
from tests.stream.helpers import apply_now
from tests.stream.test_commit import batches_of, run_clean, run_with_crashes
from tests.stream.test_open_families import _public, _timeline, open_settings
from tests.stream.test_operator import KEY, Run

COMPACT = b"DPC\x05"
FULL = b"DPC\x04"  # format 4: the mechanism's whole state


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


# ------------------------------------------------------------ keys filed nowhere


def _dormant(data: dict[str, bytes], form: bytes = COMPACT) -> list[str]:
    """The keys whose stored value is in `form` (compact, or FULL: format 4) and filed
    nowhere (`Operator.due_tick`)."""
    return sorted(k[2:] for k, v in data.items()
                  if k.startswith("c/pages[") and v.startswith(form)
                  and counter_filed_due(v) is None)


class DropsOneTick(Operator):
    """Control: a key woken from its stored value seals one ⊥ tick fewer than the ticks
    since its stored tick before its input (its input one tick early: a state that is
    consistent, frontier and mechanism, but not the counter's)."""

    def _seal_key(self, name: str, cs: CounterState, n: int, frontier: int,
                  out: Any) -> bool:
        if (cs.admission is not None and cs.admission.first is not None and cs.pending
                and cs.frontier < min(cs.pending) - 1 and not cs.queue
                and cs.mechanism.next_due() is None):
            first = min(cs.pending)
            cs.pending[first - 1] = cs.pending.pop(first)
        return super()._seal_key(name, cs, n, frontier, out)


def _revived(calibration: str, op_class: type[Operator],
             events: tuple[int, int] = (1, 5)) -> tuple[int, int, int]:
    """Keys with `events` (1 to 5: stored compact; 9 to 14: format 4) events on distinct
    ticks over 900 ticks (ECC, heartbeats every 7), then one more event each at tick
    901: each key's counter as stored after the marker through 901, against the key's
    counter stepped at every tick from the family's start with its inputs (no skip,
    never stored). Returns (keys filed nowhere in that form before their last event,
    keys compared, mismatches: mechanism bytes or frontier that differ, or a value that
    does not decode)."""
    s = open_settings(mechanism="ecc", calibration=calibration, epsilon=4.0,
                      heartbeat_ticks=7)
    T = 900
    rng = random.Random(21)
    keys = {f"k{i}": sorted(rng.sample(range(1, T - 100), rng.randint(*events)))
            for i in range(14)}
    run = Run(s, CalibratedRegistry(calibration))
    run.op = op_class(s, KEY, factory=CalibratedRegistry(calibration))
    for r in _timeline(keys, T):
        run.feed(r)
    dormant = len(_dormant(run.store.data, COMPACT if events[1] <= COMPACT_EVENTS else FULL))
    for k in sorted(keys):
        run.event(key_counter("pages", k), T + 1)
        keys[k].append(T + 1)
    run.marker(T + 1)
    compared = wrong = 0
    for k, ticks in sorted(keys.items()):
        name = key_counter("pages", k)
        ref = registry.make("ecc", s.epsilon, s.delta, KEY,
                            counter_id(noise_identity(s, KEY), name),
                            calibration=calibration)
        for n in range(T + 2):  # the family starts at global tick 0: local tick n + 1
            ref.update(1.0 if n in ticks else None)
        compared += 1
        try:
            cs = CounterState.from_bytes(run.store.data[f"c/{name}"], registry, KEY)
        except StateFormatError:
            wrong += 1
            continue
        wrong += (cs.mechanism.to_bytes() != ref.to_bytes() or cs.frontier != T + 1)
    return dormant, compared, wrong


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_a_key_filed_nowhere_wakes_as_the_counter_that_never_stopped(calibration: str) -> None:
    """ECC keys waiting with nothing due are filed nowhere between their inputs (no
    marker seals their ⊥ ticks); the marker of a key's next input seals those ticks from
    its stored value by one exact skip: its state is, byte for byte, the counter stepped
    at every tick that was never stored. Control: one ⊥ tick fewer is caught."""
    dormant, compared, wrong = _revived(calibration, Operator)
    assert dormant >= 10 and compared == 14 and wrong == 0
    _, _, wrong = _revived(calibration, DropsOneTick)
    assert wrong > 0


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_a_key_in_format_4_filed_nowhere_wakes_as_the_counter_that_never_stopped(
        calibration: str) -> None:
    """The same with 9 to 14 events per key (more than COMPACT_EVENTS: stored in format
    4, the mechanism's whole state): every key waits filed nowhere in format 4 before
    its last event, and its marker seals the ticks since by one exact skip from the
    decoded value (no replay): byte for byte the counter stepped at every tick. Control:
    one ⊥ tick fewer is caught."""
    dormant, compared, wrong = _revived(calibration, Operator, (9, 14))
    assert dormant == 14 and compared == 14 and wrong == 0
    _, _, wrong = _revived(calibration, DropsOneTick, (9, 14))
    assert wrong > 0


def _waiting_timeline(seed: int, T: int) -> list[bytes]:
    """16 keys with 1 to 6 events (stored compact), 8 with 9 to 14 (format 4), a heavy
    key (admitted) and a declared counter."""
    rng = random.Random(seed)
    keys = {f"k{i}": sorted(rng.sample(range(1, T - 10), rng.randint(1, 6)))
            for i in range(16)}
    keys.update({f"m{i}": sorted(rng.sample(range(1, T - 10), rng.randint(9, 14)))
                 for i in range(8)})
    keys["heavy"] = list(range(5, T))
    return _timeline(keys, T, declared=[3, 9, 200])


def _waiting_full(value: bytes) -> bool:
    """A format-4 value of a key not admitted yet."""
    if bytes(value[:4]) != FULL:
        return False
    adm = CounterState.from_bytes(value, registry, KEY).admission
    return adm is not None and adm.admitted is None


def test_restoring_at_every_record_equals_never_stopping_with_keys_filed_nowhere() -> None:
    """Every record applied by a new operator on the store (the due wheel rebuilt from
    the stored filed_due at each: a key filed nowhere is in it only once an event files
    it): the public records, marker by marker, and the stored bytes after each record
    are those of one operator that never stopped; keys were filed nowhere. Control: a
    rebuild that files no compact value (one with events pending included) differs."""
    s = open_settings(mechanism="ecc", heartbeat_ticks=5)
    records = _waiting_timeline(4, 500)

    def run(restore: bool) -> tuple[list[list[bytes]], list[dict[str, bytes]]]:
        store = DictStore()
        op = Operator(s, KEY, factory=registry)
        trace: list[list[bytes]] = []
        stores: list[dict[str, bytes]] = []
        for offset, r in enumerate(records):
            if restore:
                op = Operator(s, KEY, factory=registry)
            out = apply_now(op, store, 0, offset, r)
            trace.append([e.to_json() for e in out.ledger]
                         + [x.to_json() for x in out.decoded_releases()])
            stores.append(dict(store.data))
        return trace, stores

    never = run(False)
    assert any(b'"pages[heavy]"' in x for m in never[0] for x in m)  # admitted
    assert len(_dormant(never[1][-1])) >= 8
    assert len(_dormant(never[1][-1], FULL)) == 8
    assert run(True) == never
    real = counter_filed_due

    def compact_unfiled(value: bytes) -> int | None:
        return None if bytes(value[:4]) == COMPACT else real(value)

    def full_unfiled(value: bytes) -> int | None:
        return None if _waiting_full(value) else real(value)

    for control in (compact_unfiled, full_unfiled):
        with mock.patch.object(operator_module, "counter_filed_due", control):
            assert run(True)[1][-1] != never[1][-1]


def test_a_crash_anywhere_with_keys_filed_nowhere_equals_never_stopping() -> None:
    """Batches of records, periodic checkpoints that are not full, crashes at random
    points (a new operator on the last checkpoint's store, the records after it applied
    again): what is published (no second, different value anywhere), every record sent
    in order, and the store after a final full checkpoint are those of a checkpoint per
    batch; keys were filed nowhere."""
    s = open_settings(mechanism="ecc", heartbeat_ticks=5)
    rng = random.Random(8)
    batches = batches_of(_waiting_timeline(5, 500), rng)
    clean_store, clean_pub = run_clean(s, batches, registry)
    assert len(_dormant(clean_store.data)) >= 8
    assert len(_dormant(clean_store.data, FULL)) == 8
    store, pub, crashes = run_with_crashes(s, batches, registry, 9, 0.9, 12)
    assert crashes >= 6
    assert pub.releases == clean_pub.releases and pub.ledger == clean_pub.ledger
    assert pub.order == clean_pub.order
    assert store.data == clean_store.data


class WritesCounted(DictStore):
    """A store counting the writes of each key."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: dict[str, int] = {}

    def write_many(self, writes: Any) -> None:
        writes = list(writes)
        for k, _ in writes:
            self.writes[k] = self.writes.get(k, 0) + 1
        super().write_many(writes)


class Touches(Operator):
    """Counts, per counter, the markers that took it from the due wheel."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.touches: dict[str, int] = {}

    def _idle_entry(self, txn: Any, name: str, entry: Any) -> Any:
        self.touches[name] = self.touches.get(name, 0) + 1
        return super()._idle_entry(txn, name, entry)


class HeartbeatFiled(Touches):
    """Control: a waiting key never due without input filed at its heartbeat tick."""

    def due_tick(self, cs: CounterState) -> int | None:
        due = super().due_tick(cs)
        return cs.start_tick + cs.next_heartbeat - 1 if due is None else due


#: Ten events: more than COMPACT_EVENTS, so stored in format 4, and not admitted.
MIDDLE: list[int] = [2, 7, 11, 19, 23, 30, 44, 51, 60, 71]


def _quiet_upkeep(op_class: type[Touches]) -> tuple[dict[str, int], dict[str, int]]:
    """A waiting ECC key with 2 events (stored compact), one with 10 (`MIDDLE`: format
    4), an admitted key (one event a tick to 239: admitted at 204) and a declared
    counter, all idle after tick 250, then 1,000 quiet markers (heartbeats every 5
    ticks, a checkpoint that is not full every 3 markers, a restart on the store at the
    500th). Returns the markers that took each
    from the due wheel, and the writes of each, over the quiet markers."""
    s = open_settings(mechanism="ecc", epsilon=50.0, heartbeat_ticks=5)
    records = _timeline({"light": [3, 40], "middle": MIDDLE, "heavy": list(range(1, 240))},
                        250, declared=[3, 4, 50])
    store = WritesCounted()
    bc = BatchCommit(op_class(s, KEY, factory=registry), store, CollectingSink())
    for offset, r in enumerate(records):
        asyncio.run(bc.apply(0, [(offset, r)]))
    asyncio.run(bc.checkpoint())
    heavy = CounterState.from_bytes(store.data[f"c/{key_counter('pages', 'heavy')}"],
                                    registry, KEY)
    assert heavy.admission is not None and heavy.admission.admitted is not None
    assert _waiting_full(store.data[f"c/{key_counter('pages', 'middle')}"])
    op = bc.operator
    assert isinstance(op, Touches)
    op.touches.clear()
    store.writes.clear()
    touches: dict[str, int] = {}
    offset = len(records)
    for i, n in enumerate(range(251, 1251)):
        if n == 750:  # a restart: the due wheel rebuilt from the store
            for k, v in op.touches.items():
                touches[k] = touches.get(k, 0) + v
            bc = BatchCommit(op_class(s, KEY, factory=registry), store, CollectingSink())
            op = bc.operator
            assert isinstance(op, Touches)
        asyncio.run(bc.apply(0, [(offset, encode_marker(n))]))
        offset += 1
        if i % 3 == 2:
            asyncio.run(bc.checkpoint(full=False))
    for k, v in op.touches.items():
        touches[k] = touches.get(k, 0) + v
    return touches, {k[2:]: v for k, v in store.writes.items() if k.startswith("c/")}


def test_a_waiting_key_idle_for_many_heartbeats_is_neither_woken_nor_rewritten() -> None:
    """Over 1,000 quiet ticks (200 heartbeat intervals) and a restart, a waiting ECC key
    is never taken by a marker nor written, stored compact or in format 4, while the
    admitted key and the declared counter are taken at every heartbeat and written
    every few. Control: the keys filed at their heartbeat tick (the placeholder) are
    taken and rewritten as often as they."""
    light, heavy = key_counter("pages", "light"), key_counter("pages", "heavy")
    middle = key_counter("pages", "middle")
    # Written once per DEFERRED_HEARTBEATS + 2 heartbeats of 5 ticks (docs/state.md).
    every_few = 1000 // (5 * (DEFERRED_HEARTBEATS + 2))
    touches, writes = _quiet_upkeep(Touches)
    for name in (light, middle):
        assert touches.get(name, 0) == 0 and writes.get(name, 0) == 0, name
    for name in (heavy, "declared"):
        assert touches[name] >= 1000 // 5 - 2 and writes[name] >= every_few, name
    touches, writes = _quiet_upkeep(HeartbeatFiled)
    for name in (light, middle):
        assert touches[name] >= 1000 // 5 - 2 and writes[name] >= every_few, name


@pytest.mark.parametrize("ticks", [[3, 40], MIDDLE])
def test_a_key_filed_at_its_heartbeat_by_the_code_before_is_unfiled_once(
        ticks: list[int]) -> None:
    """A waiting ECC key stored filed at its heartbeat tick (the schedule of the code
    before, `HeartbeatFiled`; stored compact, or in format 4, where a restore reads an
    idle entry off the value), restarted under this code: the first marker that takes it
    writes it once, filed nowhere and otherwise as it was (mechanism, frontier), and no
    marker takes it again."""
    s = open_settings(mechanism="ecc", epsilon=50.0, heartbeat_ticks=5)
    light = key_counter("pages", "light")
    store = WritesCounted()
    bc = BatchCommit(HeartbeatFiled(s, KEY, factory=registry), store, CollectingSink())
    records = _timeline({"light": ticks}, 100)
    for offset, r in enumerate(records):
        asyncio.run(bc.apply(0, [(offset, r)]))
    asyncio.run(bc.checkpoint())
    before = store.data[f"c/{light}"]
    assert counter_filed_due(before) is not None
    assert bytes(before[:4]) == (COMPACT if len(ticks) <= COMPACT_EVENTS else FULL)
    op = Touches(s, KEY, factory=registry)
    bc = BatchCommit(op, store, CollectingSink())
    store.writes.clear()
    for i, n in enumerate(range(101, 400)):
        asyncio.run(bc.apply(0, [(len(records) + i, encode_marker(n))]))
        if i % 3 == 2:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint())
    after = store.data[f"c/{light}"]
    assert op.touches[light] == 1 and store.writes[f"c/{light}"] == 1
    assert counter_filed_due(after) is None
    assert (stored_offset(after) or 0) > (stored_offset(before) or 0) > 0
    old, new = (CounterState.from_bytes(v, registry, KEY) for v in (before, after))
    assert new.mechanism.to_bytes() == old.mechanism.to_bytes()
    assert new.frontier == old.frontier


def test_a_waiting_key_released_as_idle_holds_no_idle_entry() -> None:
    """SimECC keys waiting for admission (due at their checkpoints, filed at a tick) and
    every idle counter released (`idle_decoded` 0), periodic checkpoints that are not
    full: no waiting key holds an idle entry (it would never be used: `_beat_idle`
    declines waiting keys), while the declared counter and the admitted key do; what is
    published (in order) and the store after each checkpoint and at the end are those of
    the run that keeps every value decoded (no entry, no release)."""
    s = open_settings(mechanism="simecc", heartbeat_ticks=5)
    T = 400
    keys = {**_keys(6, 12, T), "heavy": list(range(5, T))}
    records = _timeline(keys, T, declared=[3, 9])
    heavy = key_counter("pages", "heavy")

    def run(op: Operator) -> tuple[list[bytes], list[dict[str, bytes]], int, int]:
        store = DictStore()
        sink = CollectingSink()
        bc = BatchCommit(op, store, sink)
        stores: list[dict[str, bytes]] = []
        waiting_entries = other_entries = 0
        for offset, r in enumerate(records):
            asyncio.run(bc.apply(0, [(offset, r)]))
            for name, entry in op._deferred.get(0, {}).items():
                if len(entry) > 3:
                    if name.startswith("pages[") and name != heavy:
                        waiting_entries += 1
                    else:
                        other_entries += 1
            if offset % 3 == 2:
                asyncio.run(bc.checkpoint(full=False))
                stores.append(dict(store.data))
        asyncio.run(bc.checkpoint())
        stores.append(dict(store.data))
        public = [e.to_json() for e in sink.ledger] + [x.to_json() for x in sink.releases]
        return public, stores, waiting_entries, other_entries

    released = run(Operator(s, KEY, factory=registry, idle_decoded=0))
    decoded = run(KeepsDecoded(s, KEY, factory=registry))
    assert any(b'"pages[heavy]"' in x for x in released[0])  # admitted
    assert released[2] == 0 and released[3] > 100
    assert released[:2] == decoded[:2]
