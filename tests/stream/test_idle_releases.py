"""Releases byte-identical to those of the code before idle counters' heartbeats came
from their idle entries (`Operator._beat_idle`) and their deferred writes from their
bytes (`Counter.advance_state`): seeded runs of the pure operator, ECC and SimECC under
both calibrations, every idle counter released (idle_decoded = 0) with periodic
checkpoints that are not full, hashed (SHA-256 of every release and ledger entry as
published, in order) and compared with the hashes the code before gave for the same
runs (main at 5665904, computed by `_digest` on it). Deterministic: fixed seeds, no
false alarms. The run that keeps every counter decoded gives the same hash; control: a
heartbeat floor one tick later (heartbeats left out here and there) changes it."""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any
from unittest import mock

import pytest

from processor.core import registry
from processor.core.rng import NoiseKey
from processor.stream.model import operator, state
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore
from tests.stream.test_commit import batches_of
from tests.stream.test_operator import KEY, random_timeline, settings, to_records

#: The deferral bound of these runs, in heartbeat intervals: 16 (112 ticks), so that a
#: 400-tick run writes idle counters at the bound several times; the worker's bound
#: (`operator.DEFERRED_HEARTBEATS`) is longer. The code before the bound was a parameter
#: ran with 16.
BOUND = 16


def _idle_operator(s: Settings) -> Operator:
    """An operator of these runs: every idle counter released, the bound BOUND."""
    return Operator(s, KEY, idle_decoded=0, defer_heartbeats=BOUND)

#: (mechanism, calibration) -> the hash main (5665904) gave for `_digest(...)`.
GOLDEN = {
    ("ecc", "paper"):
        "e093e6796d1534c304b88f04677e2e460ea2e659e720c35b79c28326bf9cc16d",
    ("ecc", "tight"):
        "a358c3ec2771b8e15a7b1572ac53e554f262c71bd6a14ad09c33b247c48aa6fa",
    ("simecc", "paper"):
        "c6c5d41207d111bac127c2ff182138b4d4b2f78661db868fbe3d149a967374bf",
    ("simecc", "tight"):
        "b427c1274bfdfad615b059e2a2bec46034381235bce49d74437da18fa09e5a83",
}


def _published_digest(pub: CollectingSink, store: DictStore | None = None) -> str:
    """SHA-256 of the ledger entries and releases published, in order, then of the
    stored values by key when `store` is given."""
    h = hashlib.sha256()
    for r in pub.ledger:
        h.update(r.to_json())
    for rel in pub.releases:
        h.update(rel.to_json())
    data = store.data if store is not None else {}
    for k in sorted(data):
        h.update(k.encode() + data[k])
    return h.hexdigest()


def _digest(mechanism: str, calibration: str, idle_decoded: int, bound: int = BOUND) -> str:
    names = [f"k{i:02d}" for i in range(30)]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism=mechanism, epsilon=1.0,
                 calibration=calibration, heartbeat_ticks=7, heartbeat_spread=True)
    rng = random.Random(11)
    recs = random_timeline(rng, names[:6], 100, 400, 0.08)
    records = to_records(recs, 4)
    pub = CollectingSink()
    op = Operator(s, KEY, idle_decoded=idle_decoded, defer_heartbeats=bound)
    bc = BatchCommit(op, DictStore(), pub)
    schedule = random.Random(5)
    for batch in batches_of(records, rng):
        asyncio.run(bc.apply(0, batch))
        if schedule.random() < 0.3:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint())
    return _published_digest(pub)


@pytest.mark.parametrize("mechanism,calibration", sorted(GOLDEN))
def test_releases_equal_those_before(mechanism: str, calibration: str) -> None:
    beats: list[bool] = []
    writes: list[bytes | None] = []
    beat, advance = Operator._beat_idle, state.advance_counter_value

    def counted_beat(*a: Any) -> bool:
        beats.append(beat(*a))
        return beats[-1]

    def counted_advance(*a: Any) -> bytes | None:
        writes.append(advance(*a))
        return writes[-1]

    with (mock.patch.object(Operator, "_beat_idle", counted_beat),
          mock.patch.object(operator, "advance_counter_value", counted_advance)):
        got = _digest(mechanism, calibration, 0)
    assert got == GOLDEN[(mechanism, calibration)]
    # The paths in question ran: heartbeats from idle entries, writes from bytes.
    assert sum(beats) > 300 and sum(w is not None for w in writes) > 25
    assert _digest(mechanism, calibration, 1 << 30) == got
    # The worker's bound (no write at it in 400 ticks): the same releases.
    assert _digest(mechanism, calibration, 0, operator.DEFERRED_HEARTBEATS) == got
    floor = operator.heartbeat_floor
    with mock.patch.object(operator, "heartbeat_floor", lambda *a: floor(*a) + 1):
        assert _digest(mechanism, calibration, 0) != got


def _stopped_store(mechanism: str, write_idle: bool) -> tuple[dict[str, bytes], int]:
    """The store after `_digest`'s run (every idle counter released) and its full
    checkpoint, with idle counters written from their bytes there (`write_idle`) or all
    decoded, sealed and released again; and how many `_write_idle` wrote."""
    names = [f"k{i:02d}" for i in range(30)]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism=mechanism, epsilon=1.0,
                 heartbeat_ticks=7, heartbeat_spread=True)
    rng = random.Random(11)
    records = to_records(random_timeline(rng, names[:6], 100, 400, 0.08), 4)
    store = DictStore()
    op = _idle_operator(s)
    bc = BatchCommit(op, store, CollectingSink())
    schedule = random.Random(5)
    for batch in batches_of(records, rng):
        asyncio.run(bc.apply(0, batch))
        if schedule.random() < 0.3:
            asyncio.run(bc.checkpoint(full=False))
    # Quiet ticks after the last marker's jump (which staged every counter): values
    # left behind in the store, some written at the bound in between.
    last = 100 + 400 + 20
    for i in range(1, 13):
        asyncio.run(bc.apply(0, [(len(records) + i, encode_marker(last + i))]))
        if i % 3 == 0:
            asyncio.run(bc.checkpoint(full=False))
    wrote: list[bool] = []
    real = Operator._write_idle

    def counted(*a: Any) -> bool:
        wrote.append(write_idle and real(*a))
        return wrote[-1]

    decoded = set(op._cached_counters)
    with mock.patch.object(Operator, "_write_idle", counted):
        asyncio.run(bc.checkpoint())
    # Those decoded for it were released again: the cache holds what it held.
    assert set(op._cached_counters) <= decoded
    return dict(store.data), sum(wrote)


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_a_full_checkpoint_writes_idle_counters_from_their_bytes(mechanism: str) -> None:
    """A full checkpoint stores, byte for byte, what decoding and sealing every counter
    left behind stores, and writes most of the idle ones without a decode (a run that
    hashed idle releases above)."""
    fast, wrote = _stopped_store(mechanism, True)
    slow, none = _stopped_store(mechanism, False)
    assert fast == slow
    assert wrote >= 15 and none == 0


def _restarted_digest(mechanism: str, calibration: str, crash: bool) -> str:
    """`_digest`'s kind of run, with restarts: now and then a fresh operator on the same
    store, after a full checkpoint (a clean stop, a takeover) or after a periodic one
    only (a crash: the deferred progress lost, the stored values behind). The hash also
    covers every stored value at the end."""
    names = [f"k{i:02d}" for i in range(30)]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism=mechanism, epsilon=1.0,
                 calibration=calibration, heartbeat_ticks=7, heartbeat_spread=True)
    rng = random.Random(13)
    records = to_records(random_timeline(rng, names[:6], 100, 400, 0.08), 4)
    pub = CollectingSink()
    store = DictStore()
    bc = BatchCommit(_idle_operator(s), store, pub)
    schedule = random.Random(7)
    for batch in batches_of(records, rng):
        asyncio.run(bc.apply(0, batch))
        if schedule.random() < 0.3:
            asyncio.run(bc.checkpoint(full=False))
        if schedule.random() < 0.06:
            asyncio.run(bc.checkpoint(full=not crash))
            bc = BatchCommit(_idle_operator(s), store, pub)
    asyncio.run(bc.checkpoint())
    return _published_digest(pub, store)


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("mechanism,calibration", sorted(GOLDEN))
def test_restored_counters_beat_without_a_decode(mechanism: str, calibration: str,
                                                 crash: bool) -> None:
    """A fresh operator on a stored state (a restore, a takeover, a restart after a
    crash) heartbeats its idle counters from entries read off their stored values
    (`Operator._stored_idle`), and a full checkpoint writes them from their stored bytes
    (`Operator._write_idle`): the releases, ledger entries and stored values are those
    of decoding every counter (both paths off), and the paths ran.
    Controls: an entry one tick late on its next heartbeat changes them, a full
    checkpoint that leaves idle counters unwritten changes them, and so does
    a view that says the mechanism is never due where the runs' idle counters have
    checkpoints that move y (SimECC, tight: regular checkpoints, smaller noise).
    Deterministic: fixed seeds, no false alarms."""
    read: list[bool] = []
    stored_idle = Operator._stored_idle

    def counted(*a: Any) -> Any:
        got = stored_idle(*a)
        read.append(got is not None)
        return got

    wrote: list[bool] = []
    write_idle = Operator._write_idle

    def counted_write(*a: Any) -> bool:
        wrote.append(write_idle(*a))
        return wrote[-1]

    with (mock.patch.object(Operator, "_stored_idle", counted),
          mock.patch.object(Operator, "_write_idle", counted_write)):
        got = _restarted_digest(mechanism, calibration, crash)
    # Full checkpoints: at every restart without a crash, else at the end only.
    assert sum(read) > 100 and sum(wrote) > (2 if crash else 100)
    with (mock.patch.object(Operator, "_stored_idle", lambda *a: None),
          mock.patch.object(Operator, "_write_idle", lambda *a: False)):
        assert _restarted_digest(mechanism, calibration, crash) == got
    quiet = state.quiet_counter

    def late_beat(raw: bytes) -> Any:
        q = quiet(raw)
        return None if q is None else q._replace(next_heartbeat=q.next_heartbeat + 1)

    with mock.patch.object(operator, "quiet_counter", late_beat):
        assert _restarted_digest(mechanism, calibration, crash) != got
    with mock.patch.object(Operator, "_write_idle", lambda *a: True):
        assert _restarted_digest(mechanism, calibration, crash) != got
    if (mechanism, calibration) != ("simecc", "tight"):
        return
    cls = type(registry.make(mechanism, 1.0, 1e-6, KEY))
    view = cls.idle_view

    def never_due(data: bytes, key: NoiseKey | None = None) -> Any:
        v = view(data, key)
        return None if v is None else v._replace(next_due=None)

    with mock.patch.object(cls, "idle_view", never_due):
        assert _restarted_digest(mechanism, calibration, crash) != got


def _young_restart(calibration: str, crash: bool, decodes: list[int]) -> str:
    """200 ECC counters created by a marker and sealed a few ticks, then stopped (a full
    checkpoint, or a crash after a periodic one): every stored value is inside its SVT's
    ⊥ run's dense prefix, as on a deployment minutes old. A fresh operator on that store
    (a restore, a takeover) seals on through 30 more ticks, across the prefix's end,
    with periodic checkpoints and a full one at the end. Appends the fresh operator's
    decodes to `decodes`; returns the hash of every release and ledger entry and of the
    stored values at the end."""
    names = [f"y{i:03d}" for i in range(200)]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism="ecc", epsilon=1.0,
                 calibration=calibration, heartbeat_ticks=7, heartbeat_spread=True)
    pub = CollectingSink()
    store = DictStore()
    bc = BatchCommit(_idle_operator(s), store, pub)
    offset = 0
    for n in (100, 102, 104):
        offset += 1
        asyncio.run(bc.apply(0, [(offset, encode_marker(n))]))
        asyncio.run(bc.checkpoint(full=False))
    if not crash:
        asyncio.run(bc.checkpoint())
    count = [0]
    decode = Operator._decode_counter

    def counted(self: Operator, raw: bytes) -> Any:
        count[0] += 1
        return decode(self, raw)

    with mock.patch.object(Operator, "_decode_counter", counted):
        bc = BatchCommit(_idle_operator(s), store, pub)
        for n in (106, 110, 115, 121, 128, 134):
            offset += 1
            asyncio.run(bc.apply(0, [(offset, encode_marker(n))]))
            asyncio.run(bc.checkpoint(full=False))
        asyncio.run(bc.checkpoint())
    decodes.append(count[0])
    return _published_digest(pub, store)


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_young_counters_restore_without_a_decode(calibration: str, crash: bool) -> None:
    """A restore of ECC counters whose stored values are inside their SVT's dense prefix
    (a deployment minutes old) decodes only the first counter (for its shape's
    mechanism): the others' idle entries and writes come from their bytes and the noise
    key (`Counter.idle_view`, `advance_state` with the key), and the releases, ledger
    entries and stored values are those of decoding every counter (both paths off).
    Control: without the key (the keyless view and advance) every counter is decoded.
    Deterministic: fixed seeds, no false alarms."""
    from processor.core.ecc import ECC

    fast: list[int] = []
    got = _young_restart(calibration, crash, fast)
    assert fast == [1]
    slow: list[int] = []
    with (mock.patch.object(Operator, "_stored_idle", lambda *a: None),
          mock.patch.object(Operator, "_write_idle", lambda *a: False)):
        assert _young_restart(calibration, crash, slow) == got
    assert slow[0] >= 200
    view, advance = ECC.idle_view.__func__, ECC.advance_state.__func__  # type: ignore[attr-defined]
    keyless: list[int] = []
    with (mock.patch.object(ECC, "idle_view",
                            classmethod(lambda cls, data, key=None: view(cls, data))),
          mock.patch.object(ECC, "advance_state",
                            classmethod(lambda cls, data, k, key=None: advance(cls, data, k)))):
        assert _young_restart(calibration, crash, keyless) == got
    assert keyless[0] >= 200


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("mechanism,calibration", [("ecc", "paper"), ("simecc", "tight")])
def test_a_restore_reads_the_bytes_its_wheel_scan_read(mechanism: str, calibration: str,
                                                       crash: bool) -> None:
    """The first marker after a restore reads the stored values of the counters it takes
    off the scan that built its due wheel (`Operator._wheel`, `_stored_raw`) instead of
    one point read each: every value served so is the one the store holds then, the
    restarted runs (and the young ones, inside the dense prefix) publish and store what
    they do reading each value from the store (`SCANNED_BYTES` 0), and so does a bound
    that keeps only a few values per marker. Control: a scan that keeps each counter's
    bytes under its neighbour's name changes what is published (the kept bytes are what
    the marker reads). Deterministic: fixed seeds, no false alarms."""
    served: list[bool] = []
    stored_raw = Operator._stored_raw

    def checked(self: Operator, txn: Any, name: str) -> bytes | None:
        got = stored_raw(self, txn, name)
        if name in self._scanned:
            served.append(got == txn.stored(self._counters, name))
        return got

    with mock.patch.object(Operator, "_stored_raw", checked):
        got = _restarted_digest(mechanism, calibration, crash)
    assert len(served) >= 10 and all(served)
    for bound in (0, 3000):
        with mock.patch.object(operator, "SCANNED_BYTES", bound):
            assert _restarted_digest(mechanism, calibration, crash) == got
    if mechanism == "ecc":
        fast: list[int] = []
        young = _young_restart(calibration, crash, fast)
        with mock.patch.object(operator, "SCANNED_BYTES", 0):
            assert _young_restart(calibration, crash, []) == young
    wheel = Operator._wheel

    def shifted(self: Operator, txn: Any, partition: int, keep: int | None = None) -> Any:
        built = partition not in self._wheels
        got = wheel(self, txn, partition, keep)
        if built and len(self._scanned) > 1:
            names = sorted(self._scanned)
            values = [self._scanned[k] for k in names]
            self._scanned.update(zip(names, values[1:] + values[:1], strict=True))
        return got

    with mock.patch.object(Operator, "_wheel", shifted):
        assert _restarted_digest(mechanism, calibration, crash) != got


def _bound_run(mechanism: str) -> tuple[str, int]:
    """60 counters, 6 with input, every idle counter released, periodic checkpoints that
    are not full, a full one at the end, on a store that copies its bytes as RocksDB
    does: the digest of what was published and stored, and how many stored values the
    markers read in batches (`PartitionTransaction.stored_many`, two keys or more)."""
    from processor.devtools.inmemory import CopyingStore
    from processor.stream.model.transaction import PartitionTransaction

    names = [f"k{i:02d}" for i in range(60)]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism=mechanism, epsilon=1.0,
                 heartbeat_ticks=7, heartbeat_spread=True)
    rng = random.Random(17)
    records = to_records(random_timeline(rng, names[:6], 100, 400, 0.05), 4)
    store = CopyingStore()
    pub = CollectingSink()
    bc = BatchCommit(_idle_operator(s), store, pub)
    read: list[int] = []
    real = PartitionTransaction.stored_many

    def counted(txn: PartitionTransaction, slot: Any, idents: Any) -> list[bytes | None]:
        read.append(len(idents))
        return real(txn, slot, idents)

    schedule = random.Random(5)
    with mock.patch.object(PartitionTransaction, "stored_many", counted):
        for batch in batches_of(records, rng):
            asyncio.run(bc.apply(0, batch))
            if schedule.random() < 0.3:
                asyncio.run(bc.checkpoint(full=False))
        asyncio.run(bc.checkpoint())
    return _published_digest(pub, store), sum(n for n in read if n >= 2)


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_values_read_in_batches_publish_and_store_the_same_bytes(mechanism: str) -> None:
    """The values a marker writes at the deferral bound read at once before it seals them
    (`Operator._read_bound_writes`) or one by one (that method left out): the same
    releases, ledger and stored bytes. Control: a batch read whose answers are shifted by
    one key (each counter advanced from its neighbour's bytes) changes them."""
    got, batched = _bound_run(mechanism)
    assert batched > 100
    with mock.patch.object(Operator, "_read_bound_writes", lambda *a: None):
        one_by_one, none = _bound_run(mechanism)
    assert none == 0 and one_by_one == got
    from processor.stream.model.transaction import PartitionTransaction

    real = PartitionTransaction.stored_many

    def shifted(txn: PartitionTransaction, slot: Any, idents: Any) -> list[bytes | None]:
        values = real(txn, slot, idents)
        return values[1:] + values[:1]

    with mock.patch.object(PartitionTransaction, "stored_many", shifted):
        shifted_digest, _ = _bound_run(mechanism)
    assert shifted_digest != got
