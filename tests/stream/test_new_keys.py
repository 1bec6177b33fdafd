"""A new key of an open family before its first event's tick is sealed (docs/open-keys.md,
"A new key's first seal"): its events wait among its pending arrivals (the lateness), and
the key is filed at its first event's tick, so no marker takes it before that tick; the
marker that seals it seals the ticks before it at once, without making the heartbeats
that would be set aside unseen. What is published and stored from that marker on is
what the schedule that sealed the key at every marker gives. Pure: no Kafka. Fixed
seeds."""

from __future__ import annotations

import random
from typing import Any

from processor.core import registry
from processor.stream.model.families import key_counter
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import CounterState, DictStore
from tests.stream.helpers import apply_now
from tests.stream.test_open_families import open_settings
from tests.stream.test_operator import KEY, TICK

#: Markers trail the events by this many ticks (the worker's lateness).
LATE = 6


def _late_timeline(keys: dict[str, list[int]], through: int, late: int = LATE,
                   declared: tuple[int, ...] = (3, 40, 41)) -> list[bytes]:
    """Per tick n: the events stamped in n (the keys' and the declared counter's), then a
    marker through n - `late`, and the last ticks' markers after the events."""
    recs: list[bytes] = []
    src = 0
    for n in range(through + late + 1):
        evs = []
        if n <= through:
            for key, ticks in sorted(keys.items()):
                for _ in range(ticks.count(n)):
                    evs.append(Event(key_counter("pages", key), n * TICK + 3, 1 << 16, 0, src))
                    src += 1
            for _ in range(declared.count(n)):
                evs.append(Event("declared", n * TICK + 5, 1 << 16, 0, src))
                src += 1
        if evs:
            recs.append(encode_batch(evs))
        if n >= late:
            recs.append(encode_marker(n - late))
    return recs


class Seals(Operator):
    """Records every seal of a key not admitted yet that ends before its first event's
    tick (`first` still unset after it: a seal whose records all go aside unseen)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.early: dict[str, int] = {}

    def _seal_key(self, name: str, cs: CounterState, n: int, frontier: int,
                  out: Output) -> bool:
        quiet = super()._seal_key(name, cs, n, frontier, out)
        assert cs.admission is not None
        if cs.admission.first is None:
            self.early[name] = self.early.get(name, 0) + 1
        return quiet


class EveryMarker(Seals):
    """The schedule before: a key whose first event's tick is not sealed yet is due at
    every marker (frontier + 1), as a counter not announced is."""

    def due_tick(self, cs: CounterState) -> int | None:
        adm = cs.admission
        if adm is not None and adm.admitted is None and adm.first is None and cs.pending:
            return cs.frontier + 1
        return super().due_tick(cs)


class FiledLate(Seals):
    """Control: a new key filed one tick after its first event's tick."""

    def due_tick(self, cs: CounterState) -> int | None:
        due = super().due_tick(cs)
        adm = cs.admission
        if (due is not None and adm is not None and adm.admitted is None
                and adm.first is None and cs.pending):
            return due + 1
        return due


def _keys(seed: int, T: int) -> dict[str, list[int]]:
    """30 light keys (1 to 4 events) and a heavy key (one event a tick from tick 5:
    admitted at epsilon 50)."""
    rng = random.Random(seed)
    keys = {f"k{i}": sorted(rng.choices(range(1, T - 20), k=rng.randint(1, 4)))
            for i in range(30)}
    keys["heavy"] = list(range(5, T))
    return keys


def _run(op_class: type[Seals], records: list[bytes], s: Any, cache_size: int = 4096,
         ) -> tuple[Seals, list[list[bytes]], list[dict[str, bytes]]]:
    """Applies `records` one at a time (each written at once); per marker its public
    records, and the store after each record."""
    op = op_class(s, KEY, factory=registry, cache_size=cache_size)
    store = DictStore()
    trace: list[list[bytes]] = []
    stores: list[dict[str, bytes]] = []
    for offset, r in enumerate(records):
        out = apply_now(op, store, 0, offset, r)
        if r.startswith(b'{"v":2,"k":"m"'):
            trace.append([e.to_json() for e in out.ledger]
                         + [x.to_json() for x in out.decoded_releases()])
        stores.append(dict(store.data))
    return op, trace, stores


def _at_first_seal(keys: dict[str, list[int]], records: list[bytes],
                   stores: list[dict[str, bytes]]) -> dict[str, bytes]:
    """Each key's stored value right after the marker that seals its first event's tick."""
    got: dict[str, bytes] = {}
    for i, r in enumerate(records):
        if not r.startswith(b'{"v":2,"k":"m"'):
            continue
        n = int(r.split(b'"n":')[1].split(b"}")[0].split(b",")[0])
        for k, ticks in keys.items():
            name = f"c/{key_counter('pages', k)}"
            if name not in got and min(ticks) <= n:
                got[name] = stores[i][name]
    return got


def test_a_new_key_is_first_sealed_by_the_marker_of_its_first_event() -> None:
    """Events 6 ticks ahead of the markers: no marker seals a new key before its first
    event's tick (the schedule before sealed each one at every marker in between); the
    public records, marker by marker, are the same (a heavy key admitted), and each key's
    stored value right after the marker that seals its first tick is, byte for byte, the
    one the schedule before stores there. Control: a key filed one tick late is stored
    otherwise there."""
    s = open_settings(mechanism="ecc", heartbeat_ticks=5)
    T = 300
    keys = _keys(11, T)
    records = _late_timeline(keys, T)
    now, public, stores = _run(Seals, records, s)
    before, public_before, stores_before = _run(EveryMarker, records, s)
    assert sum(now.early.values()) == 0
    assert all(before.early.get(key_counter("pages", k), 0) == LATE
               for k, ticks in keys.items() if min(ticks) >= LATE)
    assert any(b'"pages[heavy]"' in x for m in public for x in m)  # admitted
    assert public == public_before
    first = _at_first_seal(keys, records, stores)
    assert len(first) == len(keys)
    assert first == _at_first_seal(keys, records, stores_before)
    stores_late = _run(FiledLate, records, s)[2]
    assert first != _at_first_seal(keys, records, stores_late)


def test_a_new_keys_schedule_with_every_value_decoded_again() -> None:
    """The same run with no decoded value kept (cache 0: each record decodes what it
    touches from the store): the same public records marker by marker and the same
    store after every record."""
    s = open_settings(mechanism="ecc", heartbeat_ticks=5)
    T = 200
    records = _late_timeline(_keys(12, T), T)
    _, public, stores = _run(Seals, records, s)
    _, public0, stores0 = _run(Seals, records, s, cache_size=0)
    assert public0 == public and stores0 == stores


class HidesFirstSealHeartbeats(Seals):
    """Control: a key not admitted yet makes no heartbeat in its seal at all (those after
    an admission inside the seal are published)."""

    def _seal(self, name: str, cs: CounterState, n: int, out: Output,
              published: int | None) -> int:
        adm = cs.admission
        if adm is not None and adm.admitted is None:
            published = n
        return super()._seal(name, cs, n, out, published)


def _per_counter(trace: list[list[bytes]]) -> dict[str, list[bytes]]:
    """The releases of each counter, in order (ledger entries left out: their creation
    tag names the marker)."""
    got: dict[str, list[bytes]] = {}
    for marker in trace:
        for x in marker:
            if b'"entry":' in x:
                continue
            name = x.split(b'"counter":"')[1].split(b'"')[0].decode()
            got.setdefault(name, []).append(x)
    return got


def test_one_marker_over_a_heavy_keys_first_event_and_admission() -> None:
    """All events first, then one marker through 400 ticks (a catch-up): the heavy key's
    first seal holds its first event and its admission, and publishes, per counter, the
    very releases (its heartbeats after the admission included) that one marker a tick
    publishes. Control: a seal that makes no heartbeat of a key not admitted yet."""
    s = open_settings(mechanism="ecc", heartbeat_ticks=5)
    T = 400
    keys = _keys(13, T)
    ticked = _per_counter(_run(Seals, _late_timeline(keys, T, late=0), s)[1])
    at_once = _late_timeline(keys, T, late=T)
    assert sum(r.startswith(b'{"v":2,"k":"m"') for r in at_once) == T + 1
    # events of every tick first, then the markers: the one through T seals everything
    at_once = [r for r in at_once if not r.startswith(b'{"v":2,"k":"m"')] + [encode_marker(T)]
    once = _per_counter(_run(Seals, at_once, s)[1])
    heavy = key_counter("pages", "heavy")
    assert sum(b'"heartbeat"' in x for x in once[heavy]) >= 10
    assert once == ticked
    hidden = _per_counter(_run(HidesFirstSealHeartbeats, at_once, s)[1])
    assert hidden[heavy] != ticked[heavy]
