"""The store protocol and the state codecs. Pure: no Kafka."""

from __future__ import annotations

import orjson
import pytest

from processor.core import registry
from processor.core.errors import StateFormatError
from processor.core.rng import NoiseKey
from processor.stream.model.state import (
    CounterState,
    DueWheel,
    DuplicateFilter,
    PartitionState,
    StateVersionError,
    counter_filed_due,
    stored_offset,
    supersedes,
)

KEY = NoiseKey.from_seed(3)
KID = KEY.fingerprint()


def _counter_state() -> CounterState:
    mech = registry.make("ecc", 1.0, 1e-6, KEY, "test/a")
    cs = CounterState(mech, start_tick=100, next_heartbeat=7, key_id=KID)
    for x in (1.0, None, 0.5):
        mech.update(x)
    cs.frontier = 102
    cs.last_offset = 41
    cs.push_all((65536,))
    cs.push_all((65536,))
    cs.push_all((3,))
    cs.pending = {104: [1, 2], 106: [65536]}
    cs.last_published = 1.5
    cs.announced = True
    cs.filed_due = 103
    cs.ledger_fingerprint = "fp" * 32
    cs.creation = "cr" * 16
    cs.inputs = DuplicateFilter({"in/0": 7})
    return cs


def test_duplicate_filter_admits_each_input_offset_once_and_encodes_as_its_mapping(
        ) -> None:
    """One filter rule for counters and units: per source label, an offset at or below
    the highest admitted is a duplicate; an unnamed entry moves to the first identity
    named. Encoded as the plain mapping it holds (state bytes unchanged). Control: a
    filter that compares with `<` instead of `<=` admits a re-sent copy."""
    f = DuplicateFilter({"0": 5})
    f.adopt("0", "topic-id/0")
    assert f == {"topic-id/0": 5}
    assert not f.admit("topic-id/0", 5) and not f.admit("topic-id/0", 4)
    assert f.admit("topic-id/0", 6) and f.admit("topic-id/1", 0)
    assert not f.admit("topic-id/0", 6)
    f.adopt("0", "other-id/0")  # nothing unnamed left: a new identity starts afresh
    assert f.admit("other-id/0", 0)
    assert orjson.dumps([1, f]) == orjson.dumps([1, dict(f)])

    class Loose(DuplicateFilter):
        def admit(self, label: str, offset: int) -> bool:
            if offset < self.get(label, -1):
                return False
            self[label] = offset
            return True

    loose = Loose({"a": 3})
    assert loose.admit("a", 3), "control: the loose filter must admit the re-sent copy"


def test_counter_state_roundtrip() -> None:
    cs = _counter_state()
    raw = cs.to_bytes()
    assert cs.saved == raw
    back = CounterState.from_bytes(raw, registry, KEY)
    assert back.saved == raw and back.to_bytes() == raw
    assert back.inputs == {"in/0": 7}
    assert (back.start_tick, back.frontier, back.last_offset, list(back.queue),
            back.pending, back.last_published, back.next_heartbeat, back.announced,
            back.filed_due, back.key_id, back.ledger_fingerprint, back.creation) == (
                100, 102, 41, [[65536, 2], [3, 1]], {104: [1, 2], 106: [65536]}, 1.5, 7,
                True, 103, KID, "fp" * 32, "cr" * 16)
    assert back.pop() == 65536 and back.pop() == 65536 and back.pop() == 3
    assert not back.queue
    # A fresh state: not announced, not filed, frontier just before its start.
    fresh = CounterState(registry.make("ecc", 1.0, 1e-6, KEY, "test/b"), 5, 1, key_id=KID)
    again = CounterState.from_bytes(fresh.to_bytes(), registry, KEY)
    assert (again.frontier, again.announced, again.filed_due, again.last_offset,
            again.ledger_fingerprint, again.creation) == (4, False, None, -1, "", "")


def test_empty_queues_are_shared_and_never_filled_in_place() -> None:
    """Counters with nothing queued share one empty queue (memory at 100,000 counters);
    a push gives a counter its own, and the shared one stays empty."""
    a = CounterState(registry.make("ecc", 1.0, 1e-6, KEY, "test/q1"), 1, 1, key_id=KID)
    b = CounterState(registry.make("ecc", 1.0, 1e-6, KEY, "test/q2"), 1, 1, key_id=KID)
    restored = CounterState.from_bytes(b.to_bytes(), registry, KEY)
    assert a.queue is b.queue is restored.queue and not a.queue
    a.push_all([7, 7, 9])
    assert a.queue is not b.queue and list(a.queue) == [[7, 2], [9, 1]] and not b.queue
    assert [a.pop(), a.pop(), a.pop()] == [7, 7, 9]
    assert a.queue is b.queue and not b.queue and not restored.queue


def test_counter_state_rejects_foreign_or_corrupt_bytes() -> None:
    raw = _counter_state().to_bytes()
    for bad in (b"", b"DPQ\x01" + raw[4:], raw[:-3], raw[:8] + raw[8:].replace(b"[", b"{", 1),
                raw[:-1] + b",1]"):
        with pytest.raises(StateFormatError):
            CounterState.from_bytes(bad, registry, KEY)
    # The mechanism's tick must agree with the frontier.
    cs = _counter_state()
    cs.frontier = 110
    with pytest.raises(StateFormatError, match="frontier"):
        CounterState.from_bytes(cs.to_bytes(), registry, KEY)


def test_partition_state_roundtrip_and_errors() -> None:
    ps = PartitionState()
    ps.frontier, ps.marker_offset, ps.config_fingerprint = 9, 33, "ab" * 32
    ps.applied = 40
    ps.input_offsets = {"0": 5, "7": 1 << 40, "topic-id/3": 2}
    ps.key_id = KID
    back = PartitionState.from_bytes(ps.to_bytes())
    assert (back.applied, back.frontier, back.marker_offset, back.config_fingerprint,
            back.input_offsets, back.key_id, back.legacy_inputs) == (
                40, 9, 33, "ab" * 32, {"0": 5, "7": 1 << 40, "topic-id/3": 2}, KID, {})
    # A value of five fields (written while the filter was shared by the partition's
    # counters): that filter is where the counters' own filters start.
    five = ps.to_bytes()[:12] + orjson.dumps(orjson.loads(ps.to_bytes()[12:])[:5])
    assert PartitionState.from_bytes(five).legacy_inputs == back.input_offsets
    # The privacy unit its counters counted under; None in a value that did not record it.
    assert back.privacy_unit is None
    ps.privacy_unit = "user"
    assert PartitionState.from_bytes(ps.to_bytes()).privacy_unit == "user"
    six = ps.to_bytes()[:12] + orjson.dumps(orjson.loads(ps.to_bytes()[12:])[:6])
    assert PartitionState.from_bytes(six).privacy_unit is None
    with pytest.raises(StateFormatError):
        PartitionState.from_bytes(six[:-1] + b",7]")
    fresh = PartitionState()
    fresh.key_id = KID
    assert PartitionState.from_bytes(fresh.to_bytes()).config_fingerprint is None
    raw = ps.to_bytes()
    for bad in (b"XXXX" + raw[4:], raw[:-2], raw[:12] + b"7", raw[:6]):
        with pytest.raises(StateFormatError):
            PartitionState.from_bytes(bad)


def test_due_wheel_files_and_takes_by_tick() -> None:
    """Names come out of every tick <= n at once, each once, and stay out; a name filed
    at two ticks comes out with the first of them (a stale entry is harmless). Control:
    nothing above n comes out."""
    w = DueWheel()
    for name, tick in (("a", 5), ("b", 3), ("c", 9), ("a", 9), ("d", 5), ("e", 4)):
        w.file(name, tick)
    assert w.ticks() == [3, 4, 5, 9] and w.largest() == 2 and len(w) == 6
    assert w.take_through(2) == set()
    assert w.take_through(5) == {"a", "b", "d", "e"}
    assert w.ticks() == [9] and w.take_through(5) == set()
    w.file("b", 7)
    assert w.take_through(100) == {"a", "b", "c"} and w.ticks() == []



def test_due_wheel_counts_through_a_tick_up_to_a_limit() -> None:
    """due_through(n, limit) counts the names filed at ticks <= n (one filed at two such
    ticks twice), stopping once the count exceeds the limit, and takes nothing out.
    Controls: ticks above n do not count; a limit below the count stops past it."""
    w = DueWheel()
    for name, tick in (("a", 5), ("b", 3), ("c", 9), ("a", 4), ("d", 5)):
        w.file(name, tick)
    assert w.due_through(2, 100) == 0
    assert w.due_through(5, 100) == 4
    assert w.due_through(100, 100) == 5
    assert 1 < w.due_through(5, 1) <= 4
    assert w.ticks() == [3, 4, 5, 9] and len(w) == 5

def test_values_carry_their_offset_and_never_go_back() -> None:
    """Every stored value of format 4 carries the timeline offset it
    reflects; `supersedes` takes a value of an equal or higher offset and refuses a lower
    one or a deletion of a value that has one; legacy values (no offset) are always
    replaced. Controls: the lower offset and the deletion are refused."""
    cs = _counter_state()
    newer = cs.to_bytes()
    cs.last_offset = 30
    older = cs.to_bytes()
    assert stored_offset(newer) == 41 and stored_offset(older) == 30
    assert counter_filed_due(newer) == 103
    ps = PartitionState()
    ps.key_id, ps.applied = KID, 12
    assert stored_offset(ps.to_bytes()) == 12
    assert supersedes(newer, older) and supersedes(newer, newer)
    assert not supersedes(older, newer)
    assert not supersedes(None, newer)
    assert supersedes(older, None) and supersedes(None, None)
    assert supersedes(older, b"DPC\x03legacy") and supersedes(None, b"foreign")
    assert stored_offset(b"DPC\x03" + newer[4:]) is None


def test_state_is_bound_to_a_key_fingerprint_and_version_2_is_refused() -> None:
    """Every partition and counter value carries the noise key's
    fingerprint; a value without one is not written (ValueError) and not read
    (StateFormatError). A value of version 2 (written before the fingerprint was stored)
    is refused with StateVersionError naming the version, never adopted under whatever
    key comes first. Control: the same fields under version 3 decode."""
    ps = PartitionState()
    with pytest.raises(ValueError, match="noise key"):
        ps.to_bytes()
    with pytest.raises(ValueError, match="noise key"):
        CounterState(registry.make("ecc", 1.0, 1e-6, KEY, "test/c"), 1, 1, key_id="")
    ps.key_id = KID
    raw = ps.to_bytes()
    assert raw[:4] == b"DPP\x04" and PartitionState.from_bytes(raw).key_id == KID
    # Version 2: the same list without the key fingerprint.
    v2 = b"DPP\x02" + orjson.dumps([9, 33, None, []])
    with pytest.raises(StateVersionError, match="version 2") as info:
        PartitionState.from_bytes(v2)
    assert isinstance(info.value, StateFormatError) and info.value.version == 2
    for bad_kid in (None, "", 7):
        with pytest.raises(StateFormatError):
            PartitionState.from_bytes(b"DPP\x03" + orjson.dumps([9, 33, None, [], bad_kid]))
    # Version 3 (no offset header) is read; its offset is its last marker's.
    p3 = PartitionState.from_bytes(b"DPP\x03" + orjson.dumps([9, 33, None, [[0, 5]], KID]))
    assert (p3.applied, p3.input_offsets, p3.saved) == (33, {"0": 5}, None)

    cs = _counter_state()
    raw = cs.to_bytes()
    assert raw[:4] == b"DPC\x04"
    # Format 3 of the same state: no header; offset and filed_due inside the list.
    n = int.from_bytes(raw[20:24], "big")
    mech, meta = raw[24:24 + n], orjson.loads(raw[24 + n:])
    # The counter's input filter (the 11th field) is format 4's only: a format-3 value,
    # like a format-4 one of ten fields, decodes without one (None).
    assert meta[10] == {"in/0": 7}
    meta = meta[:10]
    meta3 = [*meta[:2], 41, *meta[2:7], 103, *meta[7:]]
    v3 = b"DPC\x03" + len(mech).to_bytes(4, "big") + mech + orjson.dumps(meta3)
    back = CounterState.from_bytes(v3, registry, KEY)
    unfiltered = raw[:24 + n] + orjson.dumps([*meta, None])
    assert back.saved is None and back.to_bytes() == unfiltered
    assert back.inputs is None and counter_filed_due(v3) == 103
    ten = CounterState.from_bytes(raw[:24 + n] + orjson.dumps(meta), registry, KEY)
    assert ten.inputs is None and ten.to_bytes() == unfiltered
    assert meta3[-3:] == [KID, "fp" * 32, "cr" * 16]
    v2 = b"DPC\x02" + len(mech).to_bytes(4, "big") + mech + orjson.dumps(meta3[:-3])
    with pytest.raises(StateVersionError, match="did not record the noise key") as cinfo:
        CounterState.from_bytes(v2, registry, KEY)
    assert cinfo.value.version == 2 and cinfo.value.current == 4
    with pytest.raises(StateVersionError):
        counter_filed_due(v2)
    for bad in ([*meta[:-3], "", "", ""], [*meta[:-3], None, "", ""], meta[:-1]):
        with pytest.raises(StateFormatError):
            CounterState.from_bytes(raw[:24 + n] + orjson.dumps(bad), registry, KEY)
