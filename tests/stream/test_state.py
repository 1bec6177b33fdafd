"""The store protocol, the buffered overlay and the state codecs. Pure: no Kafka."""

from __future__ import annotations

import orjson
import pytest

from processor.core import registry
from processor.core.errors import StateFormatError
from processor.core.rng import NoiseKey
from processor.stream.state import (
    BufferedStore,
    CounterState,
    DictStore,
    DueBucket,
    DueDirectory,
    PartitionState,
    StateVersionError,
    bucket_key,
    counter_key,
    directory_key,
    partition_key,
    write_all,
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
    cs.push(65536)
    cs.push(65536)
    cs.push(3)
    cs.pending = {104: [1, 2], 106: [65536]}
    cs.last_published = 1.5
    cs.announced = True
    cs.filed_due = 103
    cs.ledger_fingerprint = "fp" * 32
    cs.creation = "cr" * 16
    return cs


def test_counter_state_roundtrip() -> None:
    cs = _counter_state()
    raw = cs.to_bytes()
    assert cs.saved == raw
    back = CounterState.from_bytes(raw, registry, KEY)
    assert back.saved == raw and back.to_bytes() == raw
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


def test_partition_bucket_directory_roundtrip_and_errors() -> None:
    ps = PartitionState()
    ps.frontier, ps.marker_offset, ps.config_fingerprint = 9, 33, "ab" * 32
    ps.input_offsets = {0: 5, 7: 1 << 40}
    ps.key_id = KID
    back = PartitionState.from_bytes(ps.to_bytes())
    assert (back.frontier, back.marker_offset, back.config_fingerprint,
            back.input_offsets, back.key_id) == (9, 33, "ab" * 32, {0: 5, 7: 1 << 40}, KID)
    fresh = PartitionState()
    fresh.key_id = KID
    assert PartitionState.from_bytes(fresh.to_bytes()).config_fingerprint is None
    b = DueBucket(dict.fromkeys(["x", "é", "a"]))
    assert list(DueBucket.from_bytes(b.to_bytes()).names) == ["x", "é", "a"]
    d = DueDirectory()
    assert [d.add(t) for t in (5, 3, 9, 5, 4)] == [True, True, True, False, True]
    assert d.ticks == [3, 4, 5, 9] and list(d.through(5)) == [3, 4, 5]
    assert DueDirectory.from_bytes(d.to_bytes()).ticks == [3, 4, 5, 9]
    for cls, raw in ((PartitionState, ps.to_bytes()), (DueBucket, b.to_bytes()),
                     (DueDirectory, d.to_bytes())):
        for bad in (b"XXXX" + raw[4:], raw[:-2], raw[:4] + b"7"):
            with pytest.raises(StateFormatError):
                cls.from_bytes(bad)
    with pytest.raises(StateFormatError):
        DueDirectory.from_bytes(b"DPW\x01[3,2]")
    with pytest.raises(StateFormatError):
        DueBucket.from_bytes(b"DPU\x01[1]")


class Obj:
    def __init__(self, value: bytes) -> None:
        self.value = value
        self.encoded = 0

    def to_bytes(self) -> bytes:
        self.encoded += 1
        return self.value


def test_buffered_store_reads_its_own_writes_and_orders_them() -> None:
    """Reads see staged, then unsaved values, then the store; nothing reaches the store
    before `writes()` is applied; staged values are encoded once, at `writes()` (their
    last state counts); the order is buckets, directory, counters, deletions, partition
    values. Control: the store below is untouched until then."""
    inner = DictStore()
    inner.set("c/a", b"old-a")
    inner.set("u/0/3", b"bucket-3")
    buf = BufferedStore(inner)
    assert buf.get("c/a") == b"old-a"
    buf.set(partition_key(0), b"p")
    buf.set(counter_key("a"), b"new-a")
    obj = Obj(b"b1")
    buf.stage(counter_key("b"), obj)
    obj.value = b"b2"
    buf.set(directory_key(0), b"w")
    buf.delete(bucket_key(0, 3))
    buf.set(bucket_key(0, 9), b"bucket-9")
    assert buf.get("c/a") == b"new-a" and buf.get("u/0/3") is None
    assert inner.data == {"c/a": b"old-a", "u/0/3": b"bucket-3"}
    obj.encoded = 0
    writes = buf.writes()
    assert obj.encoded == 1
    assert writes == [("u/0/9", b"bucket-9"), ("w/0", b"w"), ("c/a", b"new-a"),
                      ("c/b", b"b2"), ("u/0/3", None), ("p/0", b"p")]
    write_all(inner, writes)
    assert inner.data == {"c/a": b"new-a", "c/b": b"b2", "u/0/9": b"bucket-9",
                          "w/0": b"w", "p/0": b"p"}
    # set after stage replaces the staged object, and vice versa.
    buf = BufferedStore(inner)
    buf.stage("c/x", Obj(b"x1"))
    buf.set("c/x", b"x2")
    buf.stage("c/y", Obj(b"y1"))
    buf.delete("c/y")
    assert buf.writes() == [("c/x", b"x2"), ("c/y", None)]


def test_state_is_bound_to_a_key_fingerprint_and_version_2_is_refused() -> None:
    """Issue 11 item 1: every partition and counter value carries the noise key's
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
    assert raw[:4] == b"DPP\x03" and PartitionState.from_bytes(raw).key_id == KID
    # Version 2: the same list without the key fingerprint.
    v2 = b"DPP\x02" + orjson.dumps([9, 33, None, []])
    with pytest.raises(StateVersionError, match="version 2") as info:
        PartitionState.from_bytes(v2)
    assert isinstance(info.value, StateFormatError) and info.value.version == 2
    for bad_kid in (None, "", 7):
        with pytest.raises(StateFormatError):
            PartitionState.from_bytes(b"DPP\x03" + orjson.dumps([9, 33, None, [], bad_kid]))

    cs = _counter_state()
    raw = cs.to_bytes()
    assert raw[:4] == b"DPC\x03"
    n = int.from_bytes(raw[4:8], "big")
    meta = orjson.loads(raw[8 + n:])
    assert meta[-3:] == [KID, "fp" * 32, "cr" * 16]
    v2 = b"DPC\x02" + raw[4:8 + n] + orjson.dumps(meta[:-3])
    with pytest.raises(StateVersionError, match="did not record the noise key") as cinfo:
        CounterState.from_bytes(v2, registry, KEY)
    assert cinfo.value.version == 2 and cinfo.value.current == 3
    for bad in ([*meta[:-3], "", "", ""], [*meta[:-3], None, "", ""], meta[:-1]):
        with pytest.raises(StateFormatError):
            CounterState.from_bytes(raw[:8 + n] + orjson.dumps(bad), registry, KEY)
