"""Input validation (one concrete bad record per rejection reason), timeline records (v2),
dead-letter records, the counter -> partition map, and every record the code writes
checked against its schema file (all five), including every public record the real
operator writes, with its schema_version and headers. Pure: no Kafka."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.model import records
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.families import MAX_KEY_BYTES, OpenFamily
from processor.stream.model.operator import Operator
from processor.stream.model.records import (
    DEADLETTER_RAW_LIMIT,
    LEDGER_SCHEMA_VERSION,
    LEDGER_UNIT_SCHEMA_VERSION,
    MAX_UNIT_ID,
    REASONS,
    RELEASE_SCHEMA_VERSION,
    USER_MODE_REASONS,
    DeadLetterEncoder,
    Event,
    LedgerEntry,
    Rejection,
    Release,
    TimelineBatch,
    TimelineFormatError,
    TimelineMarker,
    deadletter_record,
    decode_timeline,
    decode_timeline_rows,
    encode_batch,
    encode_marker,
    marker_tick,
    parse_input,
    partition_for,
    sealed_through,
)
from processor.stream.model.state import DictStore
from tests.stream.helpers import apply_now

SCHEMAS = Path(__file__).parents[2] / "schemas"

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = with_overrides(Settings(), counters={"signups": NOW - 3_600_000, "late": NOW + 10_000},
                   max_future_ms=60_000,
                   families={"pages": OpenFamily(NOW - 3_600_000, 1e-7)})

BAD: list[tuple[str, bytes]] = [
    ("unparsable", b"{not json"),
    ("unparsable", b"\xff\xfe\x00garbage"),
    ("unparsable", b""),
    ("schema_violation", b"[1, 2]"),
    ("schema_violation", b'{"ts": 1767225600000}'),  # no counter
    ("schema_violation", b'{"counter": "", "ts": 1767225600000}'),
    ("schema_violation", b'{"counter": 7, "ts": 1767225600000}'),
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000, "vaule": 1}'),
    ("schema_violation", b'{"counter": "signups", "ts": "yesterday"}'),
    ("schema_violation", b'{"counter": "signups", "ts": "2026-01-01T00:00:00"}'),  # no zone
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000.5}'),
    ("schema_violation", b'{"counter": "signups", "ts": true}'),
    ("schema_violation", b'{"counter": "signups", "ts": -5}'),
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000, "value": "1"}'),
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000, "value": true}'),
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000, "value": null}'),
    ("schema_violation", b'{"counter": "' + b"x" * 201 + b'", "ts": 1767225600000}'),
    # A lone surrogate is valid JSON but not encodable text (a crash later, if accepted).
    ("schema_violation", b'{"counter": "\\ud800", "ts": 1767225600000}'),
    ("schema_violation", b'{"counter": "a\\udfffb", "ts": 1767225600000}'),
    ("value_out_of_range", b'{"counter": "signups", "ts": 1767225600000, "value": 1.5}'),
    ("value_out_of_range", b'{"counter": "signups", "ts": 1767225600000, "value": -0.01}'),
    ("value_out_of_range", b'{"counter": "signups", "ts": 1767225600000, "value": 2}'),
    ("value_not_finite", b'{"counter": "signups", "ts": 1767225600000, "value": NaN}'),
    ("value_not_finite", b'{"counter": "signups", "ts": 1767225600000, "value": Infinity}'),
    ("value_not_finite", b'{"counter": "signups", "ts": 1767225600000, "value": 1e400}'),
    ("undeclared_counter", b'{"counter": "signupz", "ts": 1767225600000}'),
    ("timestamp_missing", b'{"counter": "signups"}'),
    ("timestamp_missing", b'{"counter": "signups", "ts": null, "value": 1}'),
    ("timestamp_too_far_in_future", b'{"counter": "signups", "ts": 1767225660001}'),
    ("timestamp_too_far_in_future", b'{"counter": "signups", "ts": "2026-01-02T00:00:00Z"}'),
    ("before_start", b'{"counter": "signups", "ts": 1767221999999}'),
    ("before_start", b'{"counter": "late", "ts": 1767225600000}'),
    # The unit field is validated in every mode (it is part of the schema).
    ("invalid_unit", b'{"counter": "signups", "ts": 1767225600000, "user": 7}'),
    ("invalid_unit", b'{"counter": "signups", "ts": 1767225600000, "user": ""}'),
    # An open family's key: required, checked (families.key_problem), its family's only.
    ("key_missing", b'{"counter": "pages", "ts": 1767225600000}'),
    ("invalid_key", b'{"counter": "pages", "ts": 1767225600000, "key": ""}'),
    ("invalid_key", b'{"counter": "pages", "ts": 1767225600000, "key": "\\ud800"}'),
    ("invalid_key", b'{"counter": "pages", "ts": 1767225600000, "key": "a\\u0007"}'),
    ("schema_violation", b'{"counter": "signups", "ts": 1767225600000, "key": "k"}'),
    ("before_start", b'{"counter": "pages", "ts": 1767221999999, "key": "k"}'),
]


@pytest.mark.parametrize("reason,raw", BAD)
def test_every_rejection_reason(reason: str, raw: bytes) -> None:
    got = parse_input(raw, S, NOW)
    assert isinstance(got, Rejection)
    assert got.reason == reason
    assert reason in REASONS


def test_all_reasons_are_exercised() -> None:
    assert {r for r, _ in BAD} == set(REASONS) - set(USER_MODE_REASONS)


def test_rejection_detail_never_echoes_the_value() -> None:
    for _, raw in BAD:
        got = parse_input(raw, S, NOW)
        assert isinstance(got, Rejection)
        assert "1.5" not in got.detail and "signupz" not in got.detail


def test_valid_events() -> None:
    assert parse_input(b'{"counter":"signups","ts":1767225600000}', S, NOW) == Event(
        "signups", NOW, UNIT)  # value defaults to 1; source unknown (-1, -1)
    got = parse_input(b'{"counter":"signups","ts":"2026-01-01T00:00:00.123Z","value":0.5}',
                      S, NOW, 3, 41)
    assert got == Event("signups", NOW + 123, UNIT // 2, 3, 41)
    got = parse_input(b'{"counter":"signups","ts":"2026-01-01T01:00:00+01:00","value":0}',
                      S, NOW)
    assert got == Event("signups", NOW, 0)
    # Exactly max_future_ms ahead is still accepted; the declared start itself is accepted.
    assert isinstance(parse_input(b'{"counter":"signups","ts":1767225660000}', S, NOW),
                      Event)
    assert isinstance(parse_input(b'{"counter":"signups","ts":1767222000000}', S, NOW),
                      Event)


def test_undeclared_counter_with_option() -> None:
    s = with_overrides(S, allow_undeclared=True, families={})
    assert parse_input(b'{"counter":"new","ts":1767225600000}', s, NOW) == Event(
        "new", NOW, UNIT)
    # Non-ASCII names are fine as long as they are real text.
    got = parse_input(b'{"counter":"caf\\u00e9 \\ud83d\\ude00","ts":1767225600000}', s, NOW)
    assert isinstance(got, Event) and got.counter == "caf\u00e9 \U0001f600"
    assert decode_timeline(encode_batch([got])) == TimelineBatch((got,))


def test_parse_input_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong inside validation becomes a Rejection (here: the value
    quantiser raising)."""
    def boom(v: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(records, "to_units", boom)
    # A value of 0.5 is not a plain event's (`_plain_event`): the full checks run.
    for parse in (parse_input, records.parse_input_reference):
        got = parse(b'{"counter":"signups","ts":1767225600000,"value":0.5}', S, NOW)
        assert got == Rejection("schema_violation", "not a valid event (RuntimeError)")


_COUNTERS: list[object] = ["signups", "late", "pages", "signupz", "", 7, None, "x" * 201,
                           "\ud800", "caf\u00e9"]
_TS: list[object] = [NOW, NOW - 3_600_000, NOW - 3_600_001, NOW + 10_000, NOW + 60_000,
                     NOW + 60_001, -5, 0, True, 1.5, "2026-01-01T00:00:00Z", None]
_VALUES: list[object] = [0, 1, 2, -1, True, False, 0.5, 1.0, 0.0, None, "1"]
_EXTRA: list[dict[str, object]] = [{}, {"user": "u1"}, {"user": 7}, {"key": "k"},
                                   {"vaule": 1}]


def _inputs() -> list[bytes]:
    """Every combination of a counter, a ts, a value (or none) and an extra field (or
    none), each field also left out, as the JSON an input record would hold."""
    out = []
    for counter in [*_COUNTERS, ...]:
        for ts in [*_TS, ...]:
            for value in [*_VALUES, ...]:
                for extra in _EXTRA:
                    d = {k: v for k, v in (("counter", counter), ("ts", ts),
                                           ("value", value)) if v is not ...}
                    # The escapes stay escapes in the JSON text (a lone surrogate).
                    out.append(json.dumps({**d, **extra}).replace("\\\\u", "\\u")
                               .encode())
    return out


def _plain_settings() -> list[Settings]:
    from processor.stream.model.config import with_unit
    return [S, with_overrides(S, allow_undeclared=True, families={}),
            with_unit(with_overrides(S, families={}), 1.0, 1e-6, 2, 2)]


def test_plain_events_agree_with_the_full_checks() -> None:
    """The fast path (`_plain_event`) takes only events the full checks accept, and makes
    the same Event of them: parse_input and parse_input_reference agree on every
    combination of fields (11 x 13 x 12 x 5 records, 3 configurations: event mode with
    an open family, undeclared counters allowed, user mode)."""
    raws = _inputs()
    fast = 0
    for s in _plain_settings():
        for i, raw in enumerate(raws):
            got = parse_input(raw, s, NOW, 2, i)
            assert got == records.parse_input_reference(raw, s, NOW, 2, i), raw
            obj = records._loads(raw)
            fast += records._plain_event(obj, s, NOW, 2, i) is not None
    # The fast path took exactly the plain ones: in each event-mode configuration
    # "signups" at 4 of the ts and "late" at 2, each with a value of 0, 1 or none, no
    # extra field; none in user mode.
    assert fast == 2 * (4 + 2) * 3


def test_plain_event_agreement_rejects_a_wrong_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a fast path that takes a value of 2 as 1 (or any event past max_future_ms)
    disagrees with the full checks on some record, and the comparison above sees it."""
    def wrong(obj: Any, s: Settings, now_ms: int, partition: int,
              offset: int) -> Event | None:
        if type(obj) is dict and obj.get("value") == 2 and obj.get("counter") == "signups":
            return Event("signups", int(obj["ts"]), UNIT, partition, offset)
        return None

    monkeypatch.setattr(records, "_plain_event", wrong)
    assert any(parse_input(raw, S, NOW) != records.parse_input_reference(raw, S, NOW)
               for raw in _inputs())


def test_marker_tick_reads_markers_only() -> None:
    """The prefilter the leader's restart and replay use: a marker's n; None for a batch
    (even one whose first event names a counter "m"), a malformed marker and no value."""
    assert marker_tick(encode_marker(7)) == 7
    assert marker_tick(encode_batch([Event("m", 1, 0)])) is None
    assert marker_tick(b'{"v":2,"k":"m","n":true}') is None
    assert marker_tick(None) is None and marker_tick(b"") is None


def test_timeline_roundtrip_and_errors() -> None:
    evs = (Event("a", 123, 7, 0, 5), Event("b\u00e9", 0, UNIT), Event("a", 9, 0, 2, 0))
    assert decode_timeline(encode_batch(evs)) == TimelineBatch(evs)
    assert decode_timeline_rows(encode_batch(evs)) == [
        [e.counter, e.ts_ms, e.units, e.src_partition, e.src_offset] for e in evs]
    assert decode_timeline_rows(encode_marker(4)) == TimelineMarker(4)
    assert decode_timeline(encode_batch([])) == TimelineBatch(())
    assert decode_timeline(encode_marker(99)) == TimelineMarker(99)
    assert encode_batch([Event("a", 123, 7, 0, 5)]) == (
        b'{"v":2,"k":"b","e":[["a",123,7,0,5]]}')
    assert encode_marker(-1) == b'{"v":2,"k":"m","n":-1}'
    for bad in (b"x", b"[]", b'{"v":2,"k":"q"}', b'{"v":2,"k":"m"}',
                b'{"v":2,"k":"m","n":true}', b'{"k":"m","n":3}', b'{"v":1,"k":"m","n":3}',
                b'{"v":true,"k":"m","n":3}', b'{"v":2,"k":"m","n":3,"x":1}',
                # v1 event records are not accepted any more (the timeline is internal).
                b'{"k":"e","c":"a","ts":1,"v":1}',
                b'{"v":2,"k":"b"}', b'{"v":2,"k":"b","e":{}}', b'{"v":2,"k":"b","e":[1]}',
                b'{"v":2,"k":"b","e":[["a",1,1,0]]}',
                b'{"v":2,"k":"b","e":[["a",1,65537,0,0]]}',
                b'{"v":2,"k":"b","e":[["",1,1,0,0]]}',
                b'{"v":2,"k":"b","e":[["a",-1,1,0,0]]}',
                b'{"v":2,"k":"b","e":[["a",1,true,0,0]]}',
                b'{"v":2,"k":"b","e":[["a",1,1,-2,0]]}',
                b'{"v":2,"k":"b","e":[["a",1.5,1,0,0]]}'):
        with pytest.raises(TimelineFormatError):
            decode_timeline(bad)
        with pytest.raises(TimelineFormatError):
            decode_timeline_rows(bad)


def test_deadletter_record() -> None:
    raw = b"{" + b"a" * (DEADLETTER_RAW_LIMIT + 100)
    rej = parse_input(raw, S, NOW)
    assert isinstance(rej, Rejection)
    d = orjson.loads(deadletter_record(rej, raw, "in", 3, 42))
    assert (d["reason"], d["topic"], d["partition"], d["offset"], d["truncated"]) == (
        "unparsable", "in", 3, 42, True)
    assert base64.b64decode(d["raw"]) == raw[:DEADLETTER_RAW_LIMIT]


def test_partition_for_is_stable_and_spreads() -> None:
    """Pinned values (a change would move every counter to another partition) and a
    spread check on 4000 names: each of 4 partitions gets 1000 +- 150 (a binomial
    deviation of 150 is > 5 sd: false-alarm rate < 1e-6 for a uniform hash). Control: a
    map that sends everything to one partition fails the same check."""
    assert partition_for("signups", 1) == 0
    pinned = [partition_for(n, 1000) for n in ("signups", "a", "é")]
    assert pinned == [partition_for(n, 1000) for n in ("signups", "a", "é")]
    import hashlib
    assert partition_for("a", 7) == int.from_bytes(
        hashlib.sha256(b"a").digest()[:8], "big") % 7

    def spread_ok(f: object) -> bool:
        counts = [0] * 4
        for i in range(4000):
            counts[f(f"counter-{i}", 4)] += 1  # type: ignore[operator]
        return all(abs(c - 1000) <= 150 for c in counts)

    assert spread_ok(partition_for)
    assert not spread_ok(lambda name, p: len(name) % 1)


def test_sealed_through() -> None:
    s = with_overrides(S, tick_ms=1000, lateness_ms=2500)
    # At now = 10_000 ms with 2.5 s lateness, ticks ending by 7.5 s are sealed: tick 6.
    assert sealed_through(10_000, s) == 6
    assert sealed_through(10_499, s) == 6
    assert sealed_through(10_500, s) == 7


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_every_schema_file_is_tested() -> None:
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(
        ["input-event.schema.json", "timeline-record.schema.json", "dead-letter.schema.json",
         "private-count.schema.json", "ledger-entry.schema.json",
         "ledger-family.schema.json"])


def test_input_event_schema_agrees_with_the_parser() -> None:
    """Records parse_input accepts validate; records it rejects for their shape (schema
    violations, out-of-range and non-finite values, missing ts) do not. Control: a schema
    without the value bounds would accept an out-of-range value."""
    v = _validator("input-event.schema.json")
    good = [b'{"counter":"signups","ts":1767225600000}',
            b'{"counter":"signups","ts":"2026-01-01T00:00:00.123Z","value":0.5}',
            b'{"counter":"signups","ts":1767225600000,"value":0}']
    for raw in good:
        assert isinstance(parse_input(raw, S, NOW), Event)
        v.validate(orjson.loads(raw))
    shape = {"schema_violation", "value_out_of_range", "timestamp_missing"}
    rejected = 0
    for reason, raw in BAD:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # not JSON (or NaN/Infinity): no document to validate
        # (Lone surrogates and ISO strings are beyond what the schema language checks:
        # jsonschema does not enforce "format" without extra packages.)
        # (Nor which counters are open families: a key is a schema field.)
        if (reason in shape and b"\\u" not in raw and b'"ts": "' not in raw
                and b'"key"' not in raw):
            assert not v.is_valid(doc), raw
            rejected += 1
    assert rejected >= 15
    loose = json.loads((SCHEMAS / "input-event.schema.json").read_text())
    del loose["properties"]["value"]["maximum"]
    assert jsonschema.Draft202012Validator(loose).is_valid(
        {"counter": "signups", "ts": 1, "value": 1.5})


def test_timeline_schema_validates_what_the_encoders_write() -> None:
    v = _validator("timeline-record.schema.json")
    for raw in (encode_batch([Event("a", 123, 7, 0, 5), Event("b", 0, UNIT)]),
                encode_batch([Event("a", 123, 7, 0, 5)], "S0HGxR0dScOoLSj8DILRYA"),
                encode_batch([]), encode_marker(99), encode_marker(-1)):
        v.validate(orjson.loads(raw))
    # Control: a v1 event record is valid for neither branch, nor an empty source.
    assert not v.is_valid({"k": "e", "c": "a", "ts": 1, "v": 1})
    assert not v.is_valid({"v": 2, "k": "b", "i": "", "e": []})
    assert not v.is_valid({"v": 2, "k": "b", "e": [["a", 1, 65537, 0, 0]]})



def test_dead_letter_encoder_writes_the_dict_byte_for_byte() -> None:
    """DeadLetterEncoder (and deadletter_record, which calls it) gives orjson's bytes of
    the dead-letter dict, raw truncated or not, for any topic name and coordinates."""
    rej = Rejection("contribution_bound_exceeded", 'beyond "k" for its unit')
    for topic in ("input", 'we"ird\\tö'):
        encode = DeadLetterEncoder(rej, topic)
        for raw in (b'{"c":1}', ("ü" * 3000).encode(), b"c" * 5000, b""):
            for p, o in ((0, 0), (-1, 5), (7, 2**63 - 1)):
                want = orjson.dumps({
                    "reason": rej.reason, "detail": rej.detail,
                    "raw": base64.b64encode(raw[:DEADLETTER_RAW_LIMIT]).decode("ascii"),
                    "truncated": len(raw) > DEADLETTER_RAW_LIMIT,
                    "topic": topic, "partition": p, "offset": o})
                assert encode(raw, p, o) == want
                assert deadletter_record(rej, raw, topic, p, o) == want

def test_dead_letter_schema_validates_what_deadletter_record_writes() -> None:
    v = _validator("dead-letter.schema.json")
    for reason, raw in BAD:
        rej = parse_input(raw, S, NOW)
        assert isinstance(rej, Rejection) and rej.reason == reason
        v.validate(orjson.loads(deadletter_record(rej, raw, "in", 0, 7)))
    assert not v.is_valid({"reason": "nope", "detail": "", "raw": "", "topic": "t",
                           "partition": 0, "offset": 0})


def test_private_count_schema_validates_releases() -> None:
    v = _validator("private-count.schema.json")
    for kind in ("change", "heartbeat"):
        r = Release("a", 3, 3000, 1000, 2.5, kind, "ecc", 1.0, 1e-6, 4.25, 0.05, "ff")
        v.validate(orjson.loads(r.to_json()))
    bad = orjson.loads(Release("a", 0, 0, 1000, 0.0, "change", "ecc", 1.0, 1e-6, 1.0, 0.05,
                               "ff").to_json())
    assert not v.is_valid(bad)  # tick 0 does not exist (t = 1 is the first tick)
    assert not v.is_valid(dict(bad, tick=1, queue_length=3))  # no private extras


def test_ledger_entry_schema_validates_ledger_entries() -> None:
    v = _validator("ledger-entry.schema.json")
    e = LedgerEntry("a", "simecc", 0.5, 1e-7, 1000, 5000, fingerprint="ff",
                    key_id="0123456789abcdef", creation="0123456789abcdef" * 2)
    v.validate(orjson.loads(e.to_json()))
    assert not v.is_valid(dict(orjson.loads(e.to_json()), key_id=""))  # always named
    assert not v.is_valid(dict(orjson.loads(e.to_json()), mechanism="basecc"))


# ------------------------------------------------------------------ the downstream contract

def _operator_output() -> tuple[list[LedgerEntry], list[Release]]:
    """Every public record the real operator writes for a small run, per mechanism: a
    burst of 300 events on one counter (epsilon 10, so y moves: change records) and an
    idle one (heartbeats only), sealed through tick 400."""
    ledger: list[LedgerEntry] = []
    releases: list[Release] = []
    for mechanism in ("ecc", "simecc"):
        s = with_overrides(Settings(), counters={"busy": 0, "idle": 0}, tick_ms=1000,
                           mechanism=mechanism, epsilon=10.0, heartbeat_ticks=50,
                           partitions=1)
        op = Operator(s, NoiseKey(bytes(range(32))))
        store = DictStore()
        burst = [Event("busy", i, UNIT, 0, i) for i in range(300)]
        for offset, record in enumerate((encode_batch(burst), encode_marker(400))):
            out = apply_now(op, store, 0, offset, record)
            ledger += out.ledger
            releases += out.decoded_releases()
    return ledger, releases


def test_every_public_record_the_operator_writes_validates() -> None:
    """Ledger entries and releases (both kinds, both mechanisms) from the real operator
    validate against their schema files, carry schema_version first and name it in their
    headers. Controls: the same records without schema_version, or with another version,
    fail validation."""
    ledger, releases = _operator_output()
    assert {r.kind for r in releases} == {"change", "heartbeat"}
    assert {e.mechanism for e in ledger} == {"ecc", "simecc"} and len(ledger) == 4
    for validator, recs, version, schema in (
            (_validator("ledger-entry.schema.json"), ledger, LEDGER_SCHEMA_VERSION,
             "ledger-entry"),
            (_validator("private-count.schema.json"), releases, RELEASE_SCHEMA_VERSION,
             "private-count")):
        for rec in recs:
            raw = rec.to_json()
            assert raw.startswith(b'{"schema_version":%d,' % version)
            doc = orjson.loads(raw)
            validator.validate(doc)
            headers = dict(rec.headers())
            assert headers == {"content-type": b"application/json",
                               "schema": f"{schema}/{version}".encode()}
            unversioned = {k: v for k, v in doc.items() if k != "schema_version"}
            assert not validator.is_valid(unversioned)
            assert not validator.is_valid(dict(doc, schema_version=version + 1))
            assert not validator.is_valid(dict(doc, schema_version=str(version)))


def test_schema_version_is_the_records_and_the_schemas() -> None:
    """One version per public record, stated in three places that must agree: the
    dataclass default, the schema file (const and title) and the header."""
    for name, cls, version in (("private-count.schema.json", Release, RELEASE_SCHEMA_VERSION),
                               ("ledger-entry.schema.json", LedgerEntry,
                                LEDGER_SCHEMA_VERSION)):
        schema = json.loads((SCHEMAS / name).read_text())
        fields = [f.name for f in dataclasses.fields(cls)]
        assert fields[0] == "schema_version"
        assert schema["required"][0] == "schema_version"
        if cls is LedgerEntry:
            # Version 2 (privacy_unit = "user") adds the unit fields; event-mode entries
            # stay version 1 without them (records.LedgerEntry.to_json).
            assert schema["properties"]["schema_version"]["enum"] == [
                version, LEDGER_UNIT_SCHEMA_VERSION]
            assert f"schema_version {LEDGER_UNIT_SCHEMA_VERSION}" in schema["title"]
            unit_fields = {f for f in fields if f.startswith("unit_")} | {
                "max_counters_per_unit"}
            assert set(schema["properties"]) == set(fields)
            assert set(schema["required"]) == set(fields) - unit_fields
            continue
        assert schema["properties"]["schema_version"] == {
            "const": version, "description": schema["properties"]["schema_version"][
                "description"]}
        assert f"schema_version {version}" in schema["title"]
        # The schema lists exactly the fields the code writes (no more, no fewer).
        assert set(schema["properties"]) == set(fields) == set(schema["required"])


def test_release_schema_states_the_unit_and_how_to_rebuild_y() -> None:
    """The text a subscriber reads: value's unit and lattice, the rebuild rule, the
    meaning of error_bound and beta."""
    schema = json.loads((SCHEMAS / "private-count.schema.json").read_text())
    value = schema["properties"]["value"]["description"]
    assert "in events" in value and "2^-16" in value and "real number" in value
    assert "largest tick <= t" in schema["description"]
    bound = schema["properties"]["error_bound"]["description"]
    assert "1 - beta" in bound and "|y_t - s_t|" in bound


def test_schema_file_matches_parser() -> None:
    """The JSON schema documents the same fields and bounds as parse_input."""
    schema = json.loads((SCHEMAS / "input-event.schema.json").read_text())
    assert set(schema["properties"]) == {"counter", "ts", "value", "user", "key"}
    assert schema["properties"]["user"]["maxLength"] == MAX_UNIT_ID
    assert schema["properties"]["key"]["maxLength"] == MAX_KEY_BYTES
    assert schema["required"] == ["counter", "ts"]
    assert schema["additionalProperties"] is False
    v = schema["properties"]["value"]
    assert (v["minimum"], v["maximum"], v["default"]) == (0, 1, 1)
