"""The per-unit guarantee a ledger entry states holds over the deployment's whole life
(processor/stream/model/lifetime.py, docs/privacy-unit.md "Reconfiguration"): the changes that
would make it false are refused at start with one `error:` line naming the field, a
confirmed migration states the composed guarantee, and a refused parameter change halts
at start or at a marker, never at an event. Pure: the operator on a dict store, the real
ECC counters, no Kafka.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.devtools.deployment import write_config
from processor.errors import error_line
from processor.stream.model import lifetime
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.families import family_of
from processor.stream.model.lifetime import LifetimeError, UnitClaim
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.provenance import ConfiguredProvenance, ParameterChangeError
from processor.stream.model.records import LedgerEntry, encode_batch_rows, encode_marker
from processor.stream.model.state import DictStore, PartitionState, partition_key
from processor.stream.replay.history import LedgerProvenance, ledger_history
from processor.stream.worker.app import ledger_at_start
from tests.stream.helpers import apply_now
from tests.stream.refusals import public_records, refused

SCHEMAS = Path(__file__).parents[2] / "schemas"
KEY = NoiseKey.from_seed(28)
TICK = 1000
# Per-event (4, 1e-6); heartbeats at every tick, so every marker releases (and a
# reconfigured counter's entry comes with its first release).
EVENT = with_overrides(Settings(), partitions=1, tick_ms=TICK, counters={"a": 0},
                       mechanism="ecc", epsilon=4.0, delta=1e-6, heartbeat_ticks=1,
                       heartbeat_spread=False)
# k = m = 1: the derivation is the identity, the per-event parameters are EVENT's.
USER1 = with_unit(EVENT, 4.0, 1e-6, 1, 1)
USER3 = with_overrides(with_unit(EVENT, 4.0, 1e-6, 3, 1), on_parameter_change="keep")


def _life(s: Settings, store: DictStore, first_offset: int, events: int, seal: int,
          claim: UnitClaim | None = None, log: list[bytes] | None = None
          ) -> list[LedgerEntry]:
    """`events` events of counter a at tick 1 (input offsets from `first_offset`), then
    markers through `seal`, at timeline offsets from `first_offset` (each record appended
    to `log`); the ledger entries published."""
    op = Operator(s, KEY, unit_claim=claim)
    out = Output()
    records = []
    rows = [["a", TICK + i, UNIT, 0, first_offset + i] for i in range(events)]
    if rows:
        records.append(encode_batch_rows(rows, "in"))
    records += [encode_marker(n) for n in range(1, seal + 1)]
    for i, raw in enumerate(records):
        apply_now(op, store, 0, first_offset + i, raw, out)
    if log is not None:
        log += records
    return out.ledger


def _values(entries: list[LedgerEntry]) -> list[bytes | None]:
    return [e.to_json() for e in entries]


def test_event_mode_history_refuses_user_mode_even_where_the_derivation_is_identity(
        ) -> None:
    """Event mode, 50 events of one person counted; then user mode with k = m = 1: the
    per-event parameters are the same (the parameter check alone lets it through), but
    the entry would state (4, 1e-6) per person for a counter that counted 50 of one
    person's events. Refused at start, naming privacy_unit, remedy a new deployment (no
    migration can bound the event-mode life). Controls: the same settings on a new
    deployment (empty ledger) start; user mode back to event mode is refused alike."""
    store = DictStore()
    ledger = _values(_life(EVENT, store, 0, 50, 3))
    assert ledger and (USER1.epsilon, USER1.delta) == (EVENT.epsilon, EVENT.delta)
    for s in (USER1, with_overrides(USER1, unit_confirm_migration=True)):
        with pytest.raises(LifetimeError) as err:
            ledger_at_start(s, KEY, ledger)
        assert err.value.field == "privacy_unit"
        line = error_line(err.value)
        assert line.startswith("error: privacy_unit:") and "\n" not in line
        assert "new deployment" in line and "confirm_migration" not in line
    # Control: a new deployment under the same settings states the configured claim.
    assert ledger_at_start(USER1, KEY, [])[1] == lifetime.plain(USER1)
    # Control: the other direction.
    user_ledger = _values(_life(USER1, DictStore(), 0, 1, 3))
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(EVENT, KEY, user_ledger)
    assert err.value.field == "privacy_unit"
    # Control: unchanged configurations restart as before, stating what they stated.
    assert ledger_at_start(EVENT, KEY, ledger)[1] is None
    assert ledger_at_start(USER1, KEY, user_ledger)[1] == lifetime.plain(USER1)


def test_raising_the_bound_under_keep_is_refused_unless_the_migration_states_the_composition(
        ) -> None:
    """k raised 1 -> 3 under on_parameter_change = "keep": counter a keeps its per-event
    (4, 1e-6) and the stage now keeps 3 events per unit. Refused at start, naming
    unit.max_events_per_counter. Confirmed, the migration's entries state the composed
    guarantee, computed here independently: 3 events of (4, 1e-6) by group privacy,
    (12, 1e-6 (1 + e^4 + e^8)) = (12, 3.04e-3); a later start whose composition the
    ledger already states needs no confirmation; raising k again does."""
    store = DictStore()
    first = _values(_life(USER1, store, 0, 1, 3))
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(USER3, KEY, first)
    assert err.value.field == "unit.max_events_per_counter"
    line = error_line(err.value)
    assert line.startswith("error: unit.max_events_per_counter:") and "\n" not in line
    assert "confirm_migration" in line and "new deployment" in line

    confirmed = with_overrides(USER3, unit_confirm_migration=True)
    _, claim = ledger_at_start(confirmed, KEY, first)
    assert claim is not None
    expected = 1e-6 * math.fsum(math.exp(4.0 * j) for j in range(3))
    assert (claim.max_events_per_counter, claim.max_counters_per_unit) == (3, 1)
    assert claim.unit_epsilon == 12.0
    assert expected <= claim.unit_delta <= expected * (1 + 1e-9)
    assert claim.derivation == lifetime.METHOD_LIFETIME
    # The configuration alone would state (4, 1e-6): what the ledger must not say.
    assert (USER3.unit_epsilon, USER3.unit_delta) == (4.0, 1e-6)

    second = _life(confirmed, store, 100, 2, 6, claim=claim)
    reconfigured = [e for e in second if e.entry == "reconfigured"]
    assert reconfigured, "the restored counter's first release under the new fingerprint"
    schema = json.loads((SCHEMAS / "ledger-entry.schema.json").read_text())
    for e in reconfigured:
        jsonschema.validate(orjson.loads(e.to_json()), schema)
        assert (e.counter, e.epsilon, e.delta, e.parameters) == ("a", 4.0, 1e-6, "stored")
        assert (e.contribution_bound, e.unit_epsilon, e.unit_delta, e.unit_derivation) == (
            3, 12.0, claim.unit_delta, lifetime.METHOD_LIFETIME)

    history = first + _values(second)
    # Unconfirmed, the same configuration restarts: the ledger states the composition.
    assert ledger_at_start(USER3, KEY, history)[1] == claim
    # Lowering k back cannot lower what a person already got.
    low = with_overrides(USER1, on_parameter_change="keep")
    assert ledger_at_start(low, KEY, history)[1] == claim
    # Control: a further raise is a new migration.
    user4 = with_overrides(with_unit(EVENT, 4.0, 1e-6, 4, 1), on_parameter_change="keep")
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(user4, KEY, history)
    assert err.value.field == "unit.max_events_per_counter"


def test_an_announced_counter_with_other_parameters_is_refused_at_start() -> None:
    """Under on_parameter_change = "refuse", a confirmed migration that changes the
    per-event parameters still stops at start on the announced counter (naming it and the
    field), not at the counter's next event. Controls: "keep" starts, and so does a
    configuration that no longer declares the counter."""
    first = _values(_life(USER1, DictStore(), 0, 1, 3))
    refuse = with_overrides(USER3, on_parameter_change="refuse",
                            unit_confirm_migration=True)
    with pytest.raises(ParameterChangeError) as err:
        ledger_at_start(refuse, KEY, first)
    assert (err.value.counter, err.value.field) == ("a", "epsilon")
    keep = with_overrides(refuse, on_parameter_change="keep")
    assert set(ledger_at_start(keep, KEY, first)[0]) == {"a"}
    # A counter no longer declared is never restored: nothing to refuse.
    removed = with_overrides(refuse, counters={"b": 0})
    assert set(ledger_at_start(removed, KEY, first)[0]) == {"a"}


def test_a_refused_parameter_change_halts_at_the_marker_never_at_an_event() -> None:
    """A restored counter whose parameters differ (state the ledger check cannot see:
    replay, or a counter not announced yet): its events apply without a halt (nothing is
    published at an event), the marker that touches it refuses, before publishing.
    Control: the same records under "keep" go on."""
    store = DictStore()
    _life(EVENT, store, 0, 1, 3)
    changed = with_overrides(EVENT, epsilon=2.0)
    op = Operator(changed, KEY)
    out = Output()
    apply_now(op, store, 0, 10, encode_batch_rows([["a", 4 * TICK, UNIT, 0, 10]], "in"), out)
    assert out.metrics["events_applied"] == 1 and not out.releases and not out.ledger
    with pytest.raises(ParameterChangeError) as err:
        apply_now(op, store, 0, 11, encode_marker(4), out)
    assert (err.value.counter, err.value.field) == ("a", "epsilon")
    assert not out.releases and not out.ledger
    kept = Operator(with_overrides(changed, on_parameter_change="keep"), KEY)
    out = Output()
    apply_now(kept, store, 0, 10, encode_batch_rows([["a", 4 * TICK, UNIT, 0, 10]], "in"), out)
    apply_now(kept, store, 0, 11, encode_marker(4), out)
    assert out.releases and {r.epsilon for r in out.decoded_releases()} == {4.0}


def test_replay_recomputes_the_migrated_entries() -> None:
    """Replay takes what each fingerprint's entries state per unit from the published
    ledger (the worker computed it from the ledger before them), so it recomputes a
    migrated deployment's entries byte for byte. Control: under the configuration's own
    claim (what it would state without the history) the migrated entries differ."""
    store = DictStore()
    records: list[bytes] = []
    first = _life(USER1, store, 0, 1, 3, log=records)
    confirmed = with_overrides(USER3, unit_confirm_migration=True)
    _, claim = ledger_at_start(confirmed, KEY, _values(first))
    second = _life(confirmed, store, 100, 2, 6, claim=claim, log=records)
    published = _values(first + second)
    history = ledger_history(confirmed, KEY, published)
    assert not history.problems

    def recompute(op: Operator) -> list[bytes | None]:
        out, fresh = Output(), DictStore()
        for off, raw in enumerate(records):
            apply_now(op, fresh, 0, off, raw, out)
        return _values(out.ledger)

    again = recompute(Operator(confirmed, KEY,
                               provenance=LedgerProvenance(confirmed, KEY, history)))
    assert again == published
    plain = recompute(Operator(confirmed, KEY))
    assert plain != published


@pytest.mark.kafka
def test_a_worker_refuses_to_switch_an_event_mode_deployment_to_user_mode(
        deployment_factory: Callable[..., Any]) -> None:
    """Against the real broker and worker: an event-mode deployment counts events of one
    person, stops, and restarts in user mode with k = m = 1 (the same per-event
    parameters): exit 2, one `error:` line naming privacy_unit and the remedy, no
    traceback, nothing published. Control: the event-mode configuration restarts and
    publishes."""
    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory({"a": start}, name="lifetime", partitions=1, tick_ms=tick,
                             lateness_ms=200, heartbeat_ticks=5, epsilon=500.0)
    worker = dep.worker
    worker.start()
    now = int(time.time() * 1000)
    dep.produce(orjson.dumps({"counter": "a", "ts": now, "value": 1, "user": "alice"})
                for _ in range(20))
    dep.wait_releases(lambda rs: len(rs) >= 2, timeout_s=120)
    assert worker.stop() == 0, worker.log_tail()
    ledger, counts = public_records(dep)

    user = with_unit(dep.settings, dep.settings.epsilon, dep.settings.delta, 1, 1)
    assert (user.epsilon, user.delta) == (dep.settings.epsilon, dep.settings.delta)
    write_config(user, dep.config)
    worker.start()
    error, log = refused(worker)
    assert error.startswith("error: privacy_unit:") and "new deployment" in error, log
    assert public_records(dep) == (ledger, counts)

    write_config(dep.settings, dep.config)
    worker.start()
    dep.wait_releases(lambda rs: len(rs) >= len(counts) + 2, timeout_s=120)
    assert worker.stop() == 0, worker.log_tail()


def test_state_the_ledger_does_not_reflect_yet_is_bound_to_its_mode() -> None:
    """Events counted in event mode before any marker (so no ledger entry to refuse the
    start by), then user mode with k = m = 1: the partition value records the mode its
    counters counted under, and the first marker refuses (naming privacy_unit), never
    the event before it. Controls: event mode goes on; a value that did not record the
    mode takes the configured one."""
    store = DictStore()
    op = Operator(EVENT, KEY)
    rows = [["a", TICK + i, UNIT, 0, i] for i in range(50)]
    apply_now(op, store, 0, 0, encode_batch_rows(rows, "in"), Output())
    assert PartitionState.from_bytes(store.data[partition_key(0)]).privacy_unit == "event"
    assert ledger_at_start(USER1, KEY, [])[1] == lifetime.plain(USER1)  # nothing to see
    user = Operator(USER1, KEY)
    out = Output()
    apply_now(user, store, 0, 1, encode_batch_rows([["a", TICK, UNIT, 0, 50]], "in"), out)
    with pytest.raises(LifetimeError) as err:
        apply_now(user, store, 0, 2, encode_marker(1), out)
    assert err.value.field == "privacy_unit" and not out.releases and not out.ledger
    assert "timeline partition 0" in str(err.value)
    apply_now(Operator(EVENT, KEY), store, 0, 2, encode_marker(1), Output())
    raw = store.data[partition_key(0)]
    legacy = raw[:12] + orjson.dumps(orjson.loads(raw[12:])[:6])
    store.data[partition_key(0)] = legacy
    apply_now(Operator(USER1, KEY), store, 0, 3, encode_marker(2), Output())
    assert PartitionState.from_bytes(store.data[partition_key(0)]).privacy_unit == "user"


def _plain_ledger_at_start(s: Settings, ledger: list[bytes | None]
                           ) -> tuple[dict[str, frozenset[str]], UnitClaim | None]:
    """ledger_at_start without its shortcuts: every value decoded in each pass, every
    entry's statement and every announced counter's parameters checked on their own."""
    objs = [o for o in (orjson.loads(v) if v and v[:1] == b"{" else None for v in ledger)
            if type(o) is dict and type(o.get("counter")) is str]
    pairs = [(o["counter"], st) for o in objs
             if (st := lifetime.statement(o)) is not None]
    claim = lifetime.unit_claim(s, list(dict.fromkeys(st for _, st in pairs)))
    provenance = ConfiguredProvenance(s, KEY)
    params: dict[str, set[tuple[str, float, float, str]]] = {}
    for name, st in pairs:
        params.setdefault(name, set()).add(st.parameters)
    for name in sorted(params):
        if name in s.counters or s.allow_undeclared or family_of(name) in s.families:
            for p in sorted(params[name]):
                provenance.check_stated(name, p)
    tags: dict[str, set[str]] = {}
    for o in objs:
        tag = o.get("creation")
        tags.setdefault(o["counter"], set()).add(tag if type(tag) is str else "")
    return {c: frozenset(t) for c, t in tags.items()}, claim


def _outcome(f: Callable[..., object], *args: Any) -> object:
    try:
        return f(*args)
    except (LifetimeError, ParameterChangeError) as exc:
        return type(exc), str(exc), getattr(exc, "counter", None), exc.field


def test_the_start_check_answers_what_the_plain_check_answers() -> None:
    """ledger_at_start (one statement per distinct entry, one parameter check per distinct
    parameter set) answers exactly what checking every entry on its own answers: the same
    announced map and claim, the same refusal naming the same counter and field. Over
    ledgers of 300 counters of one template entry with single entries altered: values a
    shared statement must not conflate (1 and 1.0, "4.0" and 4.0, -0.0 and 0.0, null and
    absent), a second creation tag, an undeclared counter, tombstones and foreign values.
    Control: one counter among the 300 with another epsilon is refused, by name."""
    template = orjson.loads(_values(_life(USER1, DictStore(), 0, 1, 3))[0] or b"")
    names = [f"c{i:03d}" for i in range(300)]

    def ledger(**changed: dict[str, Any]) -> list[bytes | None]:
        out: list[bytes | None] = [None, b"not json", b'{"counter": 7}']
        for n in names:
            obj = {**template, "counter": n, **changed.get(n, {})}
            out.append(orjson.dumps({k: v for k, v in obj.items() if v is not _DROP}))
        return out

    eps = template["epsilon"]
    variants = {
        "same": ledger(),
        "eps_changed": ledger(c150={"epsilon": eps * 2}),
        "eps_as_int": ledger(c007={"epsilon": int(eps)} if eps == int(eps) else {}),
        "eps_as_text": ledger(c008={"epsilon": str(eps)}),
        "negative_zero_delta": ledger(c009={"delta": -0.0}),
        "calibration_null": ledger(c010={"calibration": None}),
        "calibration_absent": ledger(c011={"calibration": _DROP}),
        "mechanism_true": ledger(c012={"mechanism": True}),
        "bound_as_float": ledger(c013={"contribution_bound": 1.0}),
        "bound_as_list": ledger(c014={"contribution_bound": [1]}),
        "event_entry": ledger(c015={"privacy_unit": "one event"}),
        "unit_null": ledger(c016={"privacy_unit": None}),
        "second_tag": ledger(c017={"creation": "other"}) + ledger()[3:4],
        "tag_not_text": ledger(c018={"creation": 5}),
    }
    declared = {n: 0 for n in names[:-1]}  # the last one undeclared
    # A confirmed migration: the parameter check, not the claim's, meets a changed epsilon.
    migrated = with_overrides(USER1, counters=declared, unit_confirm_migration=True)
    configs = [migrated, with_overrides(migrated, on_parameter_change="keep"),
               with_overrides(migrated, counters={n: 0 for n in names if n != "c150"}),
               with_overrides(EVENT, counters=declared)]
    refused_by_name = 0
    for label, values in variants.items():
        for s in configs:
            fast = _outcome(ledger_at_start, s, KEY, values)
            plain = _outcome(_plain_ledger_at_start, s, values)
            assert fast == plain, (label, s.on_parameter_change, s.privacy_unit)
            if isinstance(fast, tuple) and len(fast) == 4 and fast[2] == "c150":
                refused_by_name += 1
    # The control: refused under "refuse" where c150 is declared, only there.
    assert refused_by_name == 1
    assert ledger_at_start(configs[0], KEY, variants["same"]) == (
        _plain_ledger_at_start(configs[0], variants["same"]))


_DROP = object()
