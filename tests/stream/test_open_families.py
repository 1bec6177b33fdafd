"""Open counter families in the stream (docs/open-keys.md, "In the stream"): the key
rules and dead letters, the configuration's refusals, and the operator publishing a key
only from its admission on, with its whole count, as the core gate (OpenKey) on the
key's as-if-declared counter says. Pure: no Kafka. Deterministic (fixed noise key)."""

from __future__ import annotations

import random
import sys
import unicodedata
from typing import Any

import orjson
import pytest

from processor.core import registry
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.selection import OpenKey
from processor.devtools.deployment import write_config
from processor.stream.model.config import (
    ConfigError,
    Settings,
    load_settings,
    with_overrides,
    with_unit,
)
from processor.stream.model.families import (
    MAX_KEY_BYTES,
    OpenFamily,
    family_of,
    key_counter,
    key_problem,
)
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.operator import Operator
from processor.stream.model.provenance import ParameterChangeError
from processor.stream.model.records import (
    REASONS,
    Event,
    Rejection,
    encode_batch,
    encode_marker,
    parse_input,
)
from processor.stream.model.state import CounterState, DictStore
from processor.stream.replay import compare, ledger_history, recompute_timeline
from tests.stream.test_operator import KEY, TICK, Run, settings

START = 0
FAMILY = OpenFamily(START, 1e-7)


def open_settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(families={"pages": FAMILY}, epsilon=50.0, heartbeat_ticks=50)
    base.update(kw)
    return settings({"declared": START}, **base)


# --------------------------------------------------------------------------- keys


def test_key_names_and_their_counters() -> None:
    assert key_counter("pages", "/a[b]") == "pages[/a[b]]"
    assert family_of("pages[/a[b]]") == "pages"
    assert family_of("pages") is None and family_of("[x]") is None
    assert family_of("pages[x") is None
    assert key_problem("/home") is None and key_problem("é" * 64) is None
    for bad, why in ((None, "string"), (3, "string"), ("", "empty"), ("\ud800", "Unicode"),
                     ("a" * (MAX_KEY_BYTES + 1), "longer"), ("é" * 65, "longer"),
                     ("a\nb", "control"), ("\x00", "control")):
        problem = key_problem(bad)
        assert problem is not None and why in problem
        assert "\n" not in problem and (not isinstance(bad, str) or not bad or bad not in problem)


def test_a_key_with_a_control_character_is_refused_for_every_code_point() -> None:
    """key_problem refuses exactly the keys with a character of category Cc, every code
    point (surrogates apart) tried between two letters; control: the rule "printable
    only", which the check reads first, would refuse others too (a no-break space, a
    zero-width space)."""
    wrong = printable_only = 0
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        key = f"a{chr(cp)}b"
        control = unicodedata.category(chr(cp)) == "Cc"
        wrong += (key_problem(key) == "key contains a control character") != control
        printable_only += (not key.isprintable()) != control
    assert wrong == 0
    assert printable_only > 1000


def _parse(s: Settings, obj: dict[str, Any]) -> Event | Rejection:
    return parse_input(orjson.dumps(obj), s, now_ms=10**9)


def test_events_of_an_open_family_need_a_good_key() -> None:
    s = open_settings()
    ok = _parse(s, {"counter": "pages", "key": "/home", "ts": 5 * TICK})
    assert isinstance(ok, Event) and ok.counter == "pages[/home]"
    cases = [({"counter": "pages", "ts": 5}, "key_missing"),
             ({"counter": "pages", "key": "", "ts": 5}, "invalid_key"),
             ({"counter": "pages", "key": "x" * 129, "ts": 5}, "invalid_key"),
             ({"counter": "pages", "key": "a\tb", "ts": 5}, "invalid_key"),
             ({"counter": "pages", "key": 7, "ts": 5}, "invalid_key"),
             ({"counter": "declared", "key": "k", "ts": 5}, "schema_violation"),
             # A key's counter name is never an input counter.
             ({"counter": "pages[/home]", "ts": 5}, "undeclared_counter")]
    for obj, reason in cases:
        got = _parse(s, obj)
        assert isinstance(got, Rejection) and got.reason == reason, (obj, got)
        assert reason in REASONS
    raw = b'{"counter": "pages", "key": "\\ud800", "ts": 5}'
    got = parse_input(raw, s, now_ms=10**9)
    assert isinstance(got, Rejection) and got.reason == "invalid_key"
    # A declared counter's event is what it always was.
    plain = _parse(s, {"counter": "declared", "ts": 5})
    assert isinstance(plain, Event) and plain.counter == "declared"


# --------------------------------------------------------------------------- configuration


def test_families_are_read_from_the_file_and_enter_the_fingerprint(tmp_path: Any) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[counters]\nsignups = 0\n[families]\n'
                    'pages = { open = true, start = "1970-01-01T00:00:10Z", '
                    'selection_delta = 1e-7 }\n')
    s = load_settings(str(path), env={})
    assert dict(s.families) == {"pages": OpenFamily(10_000, 1e-7)}
    plain = with_overrides(s, families={})
    assert plain.fingerprint() != s.fingerprint()
    # Without families the fingerprint (in every release) is what it always was.
    assert plain.fingerprint() == with_overrides(Settings(), counters={"signups": 0}).fingerprint()


@pytest.mark.parametrize("text, field", [
    ("pages = { open = false, start = 0, selection_delta = 1e-7 }", "families.pages.open"),
    ("pages = { open = true, selection_delta = 1e-7 }", "families.pages.start"),
    ("pages = { open = true, start = 0 }", "families.pages.selection_delta"),
    ("pages = { open = true, start = 0, selection_delta = 1e-7, x = 1 }", "families.pages.x"),
    ("pages = { open = true, start = 0, selection_delta = 1.5 }",
     "families.pages.selection_delta"),
    ("pages = { open = true, start = 1, selection_delta = 1e-7 }", "families.pages.start"),
    ("signups = { open = true, start = 0, selection_delta = 1e-7 }", "families.signups"),
    ('"a b" = { open = true, start = 0, selection_delta = 1e-7 }', "families"),
    ("pages = 3", "families.pages"),
])
def test_bad_families_are_refused_naming_the_field(tmp_path: Any, text: str,
                                                   field: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[counters]\nsignups = 0\n[families]\n{text}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(str(path), env={})
    assert err.value.field == field


def test_families_refuse_undeclared_counters_and_accept_user_mode() -> None:
    with pytest.raises(ConfigError) as err:
        open_settings(allow_undeclared=True)
    assert err.value.field == "allow_undeclared"
    user = dict(privacy_unit="user", unit_epsilon=1.0, unit_delta=1e-6,
                max_events_per_counter=2, max_counters_per_unit=2)
    with pytest.raises(ConfigError) as err:  # epsilon is derived in user mode
        with_overrides(Settings(), counters={"a": 0}, **user, epsilon=1.0,
                       families={"pages": FAMILY})
    assert err.value.field == "epsilon"
    s = with_unit(with_overrides(Settings(), counters={"a": 0}, families={"pages": FAMILY}),
                  1.0, 1e-6, 2, 2)
    assert s.gate_delta0("pages") == FAMILY.delta0(1.0, 2)  # the unit's epsilon, m keys
    with pytest.raises(ConfigError) as err:
        with_overrides(s, unit_confirm_migration=True)
    assert err.value.field == "unit.confirm_migration"


# --------------------------------------------------------------------------- the operator


def _timeline(keys: dict[str, list[int]], through: int,
              declared: list[int] = ()) -> list[bytes]:  # type: ignore[assignment]
    """Per tick: that tick's events (keys' and the declared counter's), then a marker."""
    recs: list[bytes] = []
    src = 0
    for n in range(through + 1):
        evs = []
        for key, ticks in sorted(keys.items()):
            for _ in range(ticks.count(n)):
                evs.append(Event(key_counter("pages", key), n * TICK + 3, UNIT, 0, src))
                src += 1
        for _ in range(declared.count(n)):
            evs.append(Event("declared", n * TICK + 5, UNIT, 0, src))
            src += 1
        if evs:
            recs.append(encode_batch(evs))
        recs.append(encode_marker(n))
    return recs


def _as_declared(s: Settings, name: str, xs: list[bool]) -> list[tuple[int, float]]:
    """The key's counter run directly from the family's start (local tick t = global
    tick t - 1 here), one event per tick where xs says: its (t, y) changes."""
    c = registry.make(s.mechanism, s.epsilon, s.delta, KEY,
                      counter_id(noise_identity(s, KEY), name))
    out, last = [], 0.0
    for x in xs:
        y = c.update(1.0 if x else None)
        if y != last:
            out.append((c.t, y))
        last = y
    return out


def _expected_admission(s: Settings, name: str, xs: list[bool]) -> tuple[int, float] | None:
    """The core gate on the as-if-declared counter (OpenKey.first_seen + update): the
    first published (tick, value), or None."""
    c = registry.make(s.mechanism, s.epsilon, s.delta, KEY,
                      counter_id(noise_identity(s, KEY), name))
    assert isinstance(c, ECC | SimECC)
    first = xs.index(True) + 1
    gate = OpenKey.first_seen(c, FAMILY.delta0(s.epsilon), first)
    for x in xs[first - 1:]:
        got = gate.update(1.0 if x else None)
        if got:
            return got[0]
    return None


class NoGate(Operator):
    """Control: a key is published like a declared counter, from its first marker."""

    def _seal_key(self, name: str, cs: CounterState, n: int, frontier: int,
                  out: Any) -> bool:
        return not self._seal_declared(name, cs, n, frontier, out)


class FromAdmission(Operator):
    """Control: a key's counter starts at its first event (its count then misses nothing
    here, but its noise and schedule are not the as-if-declared counter's)."""

    _offset_tick = 0

    def _new_counter(self, name: str, start_tick: int) -> CounterState:
        if "[" in name:
            start_tick = self._offset_tick
        return super()._new_counter(name, start_tick)

    def apply(self, txn: Any, partition: int, offset: int, record: bytes,
              out: Any = None, stamp_ms: int | None = None) -> Any:
        rows = orjson.loads(record).get("e", [[None, 0]])
        self._offset_tick = rows[0][1] // TICK
        return super().apply(txn, partition, offset, record, out, stamp_ms)


def _problems(s: Settings, op_class: type[Operator], keys: dict[str, list[int]],
              T: int) -> list[str]:
    """What the published output of `op_class` on `keys` gets wrong: per key, the first
    record must be the core gate's admission (tick, value) of the key's as-if-declared
    counter, its later changes that counter's, its one ledger entry effective from the
    admission tick; a key the gate does not admit has no record at all."""
    run = Run(s, registry)
    run.op = op_class(s, KEY, factory=registry)
    problems = []
    for r in _timeline(keys, T, declared=[3, 4, 9]):
        out = run.feed(r)
        if not r.startswith(b'{"v":2,"k":"m"') and (out.releases or out.ledger):
            problems.append("a record at an event")
    for key, ticks in keys.items():
        name = key_counter("pages", key)
        xs = [t in ticks for t in range(T + 1)]  # local tick t = global tick t - 1
        mine = [r for r in run.releases if r.counter == name]
        entries = [e for e in run.ledger if e.counter == name]
        expected = _expected_admission(s, name, xs)
        if expected is None:
            if mine or entries:
                problems.append(f"{key}: published, not admitted")
            continue
        a, y_a = expected
        if not mine or (mine[0].tick, mine[0].value, mine[0].kind) != (a, y_a, "change"):
            problems.append(f"{key}: first record is not the admission")
        changes = [(r.tick, r.value) for r in mine if r.kind == "change"]
        if changes[1:] != [(t, y) for t, y in _as_declared(s, name, xs) if t > a]:
            problems.append(f"{key}: releases are not the as-if-declared counter's")
        if [(e.since_tick, e.start_ms) for e in entries] != [(a, START)]:
            problems.append(f"{key}: ledger entry")
        # Each record's error bound: the counter's at its tick (public quantities only).
        bound = registry.make(s.mechanism, s.epsilon, s.delta, KEY, "bound-only")
        if any(r.error_bound != float(bound.error_bound_at(r.tick, s.beta)) for r in mine):
            problems.append(f"{key}: error bounds")
    return problems


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_a_heavy_key_is_admitted_with_its_whole_count_and_a_light_one_never(
        mechanism: str) -> None:
    """A key with an event every tick from tick 20 is published from the tick the core
    gate admits it, with the releases of its counter run as if declared at the start
    (its events before admission counted, its noise keyed by its name); keys with three
    events and with one are never published (no ledger entry, no release) over the
    horizon; records come from markers only. Controls: publishing keys without the gate,
    and counting a key from its first event, both fail."""
    s = open_settings(mechanism=mechanism)
    T = 700
    keys = {"heavy": list(range(20, T + 1)), "light": [30, 31, 200], "one": [40]}
    name = key_counter("pages", "heavy")
    admitted = _expected_admission(s, name, [t in keys["heavy"] for t in range(T + 1)])
    assert admitted is not None and admitted[1] > 100  # its whole count at admission
    assert _problems(s, Operator, keys, T) == []
    assert any("published, not admitted" in p for p in _problems(s, NoGate, keys, T))
    assert _problems(s, FromAdmission, keys, T)


def _public(s: Settings, records: list[bytes],
            cache_size: int = 4096) -> list[list[bytes]]:
    """Per marker, the public records it produced (ledger entries, then releases); an
    event record produces none."""
    run = Run(s, registry, cache_size=cache_size)
    trace: list[list[bytes]] = []
    for r in records:
        out = run.feed(r)
        public = [e.to_json() for e in out.ledger] + [x.to_json() for x in out.releases]
        if r.startswith(b'{"v":2,"k":"m"'):
            trace.append(public)
        else:
            assert public == []
    return trace


def test_keys_not_admitted_change_no_public_record_and_restore_is_identical() -> None:
    """The public records of a declared counter and of an admitted key (bytes, order,
    and the marker that emits each) are the same with or without the events of 20 keys
    that are never admitted; and the same when every record is applied to state decoded
    again from the store (cache off). Control: the heavy key's own events do show."""
    s = open_settings(mechanism="simecc")
    T = 300
    rng = random.Random(3)
    few = {f"k{i}": sorted(rng.sample(range(T), 2)) for i in range(20)}
    heavy = {"heavy": list(range(10, T))}
    declared = [3, 4, 9, 50, 51]
    without = _public(s, _timeline(heavy, T, declared))
    full = _timeline({**few, **heavy}, T, declared)
    assert _public(s, full) == without
    assert _public(s, full, cache_size=0) == without
    assert any(b'"pages[heavy]"' in x for m in without for x in m)
    assert _public(s, _timeline({}, T, declared)) != without


def test_the_gate_state_is_stored_only_for_keys() -> None:
    """A key's counter value carries its admission state (restored as it was); a
    declared counter's value has no such field (its bytes are what they always were)."""
    s = open_settings()
    run = Run(s, registry)
    for r in _timeline({"k": [2]}, 5, declared=[2]):
        run.feed(r)
    store: DictStore = run.store
    op = Operator(s, KEY)
    values = {k: v for k, v in store.data.items() if k.startswith("c/")}
    key_state = CounterState.from_bytes(values["c/pages[k]"], op.factory, KEY)
    assert key_state.admission is not None and key_state.admission.first == 3
    assert key_state.admission.admitted is None and not key_state.announced
    declared = CounterState.from_bytes(values["c/declared"], op.factory, KEY)
    assert declared.admission is None
    assert len(orjson.loads(values["c/declared"][24 + int.from_bytes(
        values["c/declared"][20:24], "big"):])) == 11


def test_the_development_config_writer_keeps_the_families(tmp_path: Any) -> None:
    s = open_settings()
    path = write_config(s, tmp_path / "c.toml")
    assert load_settings(str(path), env={}) == s


# --------------------------------------------------------------------------- replay


def _published(s: Settings, op_class: type[Operator],
               records: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    run = Run(s, registry)
    run.op = op_class(s, KEY, factory=registry)
    for r in records:
        run.feed(r)
    return [x.to_json() for x in run.releases], [e.to_json() for e in run.ledger]


def _replay_diffs(s: Settings, records: list[bytes], releases: list[bytes],
                  ledger: list[bytes]) -> list[tuple[str, str, str]]:
    history = ledger_history(s, KEY, ledger, releases)
    res = recompute_timeline(s, KEY, {0: list(enumerate(records))}, {0: len(records)},
                             history=history)
    _rel, _led, diffs = compare(res, releases, ledger, history)
    return [(d.topic, d.key[0], d.problem) for d in diffs]


def test_replay_recomputes_every_admission() -> None:
    """Replay, from the timeline and the key, finds the worker's open-key output
    identical; it flags a key published that the gate does not admit (a worker without
    the gate: "unexpected" releases and entries of the light keys) and an admitted key
    not published ("missing")."""
    s = open_settings(mechanism="simecc")
    T = 500
    keys = {"heavy": list(range(20, T + 1)), "light": [30, 31, 200], "one": [40]}
    records = _timeline(keys, T, declared=[3, 4, 9])
    releases, ledger = _published(s, Operator, records)
    assert any(b'"pages[heavy]"' in r for r in releases)
    assert _replay_diffs(s, records, releases, ledger) == []
    forged_rel, forged_led = _published(s, NoGate, records)
    flagged = set(_replay_diffs(s, records, forged_rel, forged_led))
    for key in ("light", "one"):
        assert ("counts", f"pages[{key}]", "unexpected") in flagged
        assert ("ledger", f"pages[{key}]", "unexpected") in flagged
    dropped = [r for r in releases if b'"pages[heavy]"' not in r]
    assert ("counts", "pages[heavy]", "missing") in set(
        _replay_diffs(s, records, dropped, ledger))


def test_a_key_keeps_its_gate_and_parameters_and_never_halts_before_admission() -> None:
    """A configuration change under a key not admitted yet (epsilon and selection_delta
    changed): its marker does not refuse (a halt would reveal the key), the key goes on
    under its stored parameters and gate. Control: the same change under an admitted key
    is refused at its marker, as for a declared counter."""
    s = settings({}, families={"pages": FAMILY}, epsilon=50.0, heartbeat_ticks=50)
    s2 = with_overrides(s, epsilon=40.0, families={"pages": OpenFamily(START, 1e-9)})
    for keys, refused in (({"light": [3, 4]}, False), ({"heavy": list(range(1, 400))}, True)):
        first = Run(s, registry)
        for r in _timeline(keys, 420):
            first.feed(r)
        assert bool(first.ledger) is refused  # the heavy key was admitted, the light not
        later = Run(s2, registry, store=first.store)
        later.offset = first.offset
        if refused:
            with pytest.raises(ParameterChangeError):
                later.marker(1000)
            continue
        # The light key, never due without input, waits filed nowhere: its next event
        # brings it to the marker, which seals it on under its stored parameters.
        later.event(key_counter("pages", "light"), 999)
        later.marker(1000)
        values = {k: v for k, v in later.store.data.items() if k.startswith("c/")}
        (raw,) = values.values()
        kept = CounterState.from_bytes(raw, later.op.factory, KEY)
        assert kept.mechanism.eps == 50.0 and kept.frontier == 1000
        assert kept.admission is not None and kept.admission.delta0 == FAMILY.delta0(50.0)
        assert later.releases == [] and later.ledger == []


def test_a_key_not_admitted_is_touched_at_its_inputs_and_next_due_only() -> None:
    """A key with two events, never admitted: markers touch it at its first tick and at
    its counter's next_due (SimECC's checkpoints), not at every heartbeat, which it does
    not publish. Control: a declared counter with the same events is touched at every
    heartbeat (at least T / heartbeat_ticks times)."""
    T, h = 2000, 5
    s = settings({}, families={"pages": FAMILY}, epsilon=50.0, mechanism="simecc",
                 heartbeat_ticks=h)
    run = Run(s, registry)
    for r in _timeline({"light": [3, 4]}, T):
        run.feed(r)
    assert run.ledger == [] and run.releases == []
    declared = Run(settings({"declared": START}, epsilon=50.0, mechanism="simecc",
                            heartbeat_ticks=h), registry)
    for r in _timeline({}, T, declared=[3, 4]):
        declared.feed(r)
    assert declared.metrics["counters_touched"] >= T // h
    assert run.metrics["counters_touched"] < T // h // 4


def test_the_start_refuses_a_parameter_change_under_an_admitted_key() -> None:
    """At start, from the ledger alone, before anything is applied: a changed epsilon
    under an admitted key (on the ledger) is refused, as under a declared counter; the
    unchanged configuration starts. Control: a ledger whose only entries are another
    family's keys refuses nothing."""
    from processor.stream.worker.app import ledger_at_start

    s = settings({}, families={"pages": FAMILY}, epsilon=50.0, heartbeat_ticks=50)
    run = Run(s, registry)
    for r in _timeline({"heavy": list(range(1, 400))}, 420):
        run.feed(r)
    ledger = [e.to_json() for e in run.ledger]
    assert [e.counter for e in run.ledger] == ["pages[heavy]"]
    ledger_at_start(s, KEY, ledger)
    with pytest.raises(ParameterChangeError):
        ledger_at_start(with_overrides(s, epsilon=40.0), KEY, ledger)
    other = with_overrides(s, epsilon=40.0, families={"other": FAMILY})
    ledger_at_start(other, KEY, ledger)


def test_the_campaigns_independent_checker_finds_the_worker_right_and_a_forgery_wrong(
        ) -> None:
    """processor/devtools/open_campaign.check_open_keys (the campaign's checker, apart
    from the operator's code) on the operator's output: no violation, every key seen,
    the heavy one admitted. Controls: a worker without the gate, and the heavy key's
    first record dropped, are both caught."""
    from processor.devtools.open_campaign import check_open_keys
    from processor.stream.kafka.kafka_io import KafkaRecord

    s = open_settings(mechanism="simecc")
    T = 500
    keys = {"heavy": list(range(20, T + 1)), "light": [30, 31, 200], "one": [40]}
    records = _timeline(keys, T, declared=[3, 4, 9])
    timeline = {0: [KafkaRecord("t", 0, i, None, r, (), 0) for i, r in enumerate(records)]}

    def verdict(op_class: type[Operator], drop_first: bool = False) -> Any:
        releases, ledger = _published(s, op_class, records)
        rel = [orjson.loads(r) for r in releases]
        if drop_first:
            rel.remove(next(r for r in rel if r["counter"] == "pages[heavy]"))
        return check_open_keys(s, KEY, timeline, rel, [orjson.loads(e) for e in ledger])

    good = verdict(Operator)
    assert good.ok and (good.keys_seen, good.keys_admitted) == (3, 1), good.violations
    assert not verdict(NoGate).ok
    assert not verdict(Operator, drop_first=True).ok


def test_the_checkers_input_keeps_a_zombie_ingests_late_write_as_the_operator_does() -> None:
    """A zombie ingest may write an older input offset late: the operator's duplicate
    filter is per counter, so the event counts if its own counter had not seen it; the
    campaign checker's implied input does the same (per key), and agrees with the
    operator's count. The scenario is one a filter per input partition gets wrong: the
    late offset is below the partition's highest offset before it."""
    from processor.devtools.open_campaign import implied_inputs
    from processor.stream.kafka.kafka_io import KafkaRecord

    s = open_settings()
    a, b = key_counter("pages", "a"), key_counter("pages", "b")
    records = [encode_batch([Event(a, 2 * TICK, UNIT, 0, 3), Event(b, 2 * TICK, UNIT, 0, 6)]),
               encode_batch([Event(a, 2 * TICK, UNIT, 0, 4)]),  # the late write
               encode_batch([Event(a, 2 * TICK, UNIT, 0, 4)]),  # a re-sent copy
               encode_marker(10)]
    timeline = {0: [KafkaRecord("t", 0, i, None, r, (), 0) for i, r in enumerate(records)]}
    xs = implied_inputs(s, {a: 0, b: 0}, timeline)
    assert sum(x is not None for x in xs[a]) == 2 and sum(x is not None for x in xs[b]) == 1
    run = Run(s, registry)
    for r in records:
        run.feed(r)
    assert run.metrics["events_applied"] == 3 and run.metrics["duplicates_dropped"] == 1


class FullForm(Operator):
    """Keys' inputs are not kept, so they are stored in format 4 (the mechanism's
    state)."""

    def _first_row(self, *args: Any, **kw: Any) -> CounterState | None:
        cs = super()._first_row(*args, **kw)
        if cs is not None:
            cs.trail = None
        return cs


def _idle_run(s: Settings, records: list[bytes], idle_decoded: int,
              op_class: type[Operator] = Operator
              ) -> tuple[list[bytes], list[dict[str, bytes]], int]:
    """`records` one per batch with periodic checkpoints that are not full (seeded), then
    a full one: what was published, the store's bytes after every checkpoint, and how
    many counter values were decoded at the end."""
    import asyncio

    from processor.stream.model.commit import BatchCommit
    from processor.stream.model.outputs import CollectingSink

    op = op_class(s, KEY, idle_decoded=idle_decoded)
    store, pub = DictStore(), CollectingSink()
    bc = BatchCommit(op, store, pub)
    schedule = random.Random(9)
    snapshots: list[dict[str, bytes]] = []
    for i, r in enumerate(records):
        asyncio.run(bc.apply(0, [(i, r)]))
        if schedule.random() < 0.2:
            asyncio.run(bc.checkpoint(full=False))
            snapshots.append(dict(store.data))
    decoded = len(op._cache.section(op._counters))
    asyncio.run(bc.checkpoint())
    snapshots.append(dict(store.data))
    public = [e.to_json() for e in pub.ledger] + [x.to_json() for x in pub.releases]
    return public, snapshots, decoded


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_keys_not_admitted_are_released_when_idle(mechanism: str) -> None:
    """Keys of an open family that wait for admission leave the decoded-value cache when
    idle (their memory is their idle entry), and nothing published or stored changes:
    with every idle counter released (idle_decoded = 0) and with the cache's bound above
    them all, the published records and the store's bytes after every checkpoint are
    identical, while 40 light keys, a heavy (admitted) key and a declared counter run 400
    ticks; a waiting ECC key (never due without input: filed nowhere) is released under
    either bound, stored compact or in format 4 (`FullForm`: its inputs not kept), so
    every ECC run ends with few values decoded, while SimECC's keys, due at their
    checkpoints, stay decoded under the high bound in either form (what the count would
    show of keys kept decoded), and are released under the low one, with the same
    output."""
    s = open_settings(mechanism=mechanism, heartbeat_ticks=7)
    T = 400
    rng = random.Random(4)
    keys = {f"k{i}": sorted(rng.sample(range(T // 2), 2)) for i in range(40)}
    keys["heavy"] = list(range(10, T))
    records = _timeline(keys, T, declared=[3, 4, 9, 50, 51])
    public, states, decoded = _idle_run(s, records, 1 << 30)
    released_public, released_states, released_decoded = _idle_run(s, records, 0)
    assert released_public == public and released_states == states
    assert any(b'"pages[heavy]"' in x for x in public)
    # SimECC's keys are due at every checkpoint: kept decoded under the cache's bound.
    assert (decoded <= 4 if mechanism == "ecc" else decoded >= 42) and released_decoded <= 4
    full_public, _full_states, full_decoded = _idle_run(s, records, 1 << 30, FullForm)
    full_released, _states, full_released_decoded = _idle_run(s, records, 0, FullForm)
    assert full_public == full_released == public
    assert (full_decoded <= 4 if mechanism == "ecc" else full_decoded >= 42)
    assert full_released_decoded <= 4
