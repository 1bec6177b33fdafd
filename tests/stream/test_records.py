"""Input validation (one concrete bad record per rejection reason), timeline records,
dead-letter records and the counter -> partition map. Pure: no Kafka."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest

from processor.core.grid import UNIT
from processor.stream.config import Settings, with_overrides
from processor.stream.records import (
    DEADLETTER_RAW_LIMIT,
    REASONS,
    Rejection,
    TimelineEvent,
    TimelineFormatError,
    TimelineMarker,
    ValidEvent,
    deadletter_record,
    decode_timeline,
    encode_event,
    encode_marker,
    parse_input,
    partition_for,
    sealed_through,
)

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = with_overrides(Settings(), counters={"signups": NOW - 3_600_000, "late": NOW + 10_000},
                   max_future_ms=60_000)

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
]


@pytest.mark.parametrize("reason,raw", BAD)
def test_every_rejection_reason(reason: str, raw: bytes) -> None:
    got = parse_input(raw, S, NOW)
    assert isinstance(got, Rejection)
    assert got.reason == reason
    assert reason in REASONS


def test_all_reasons_are_exercised() -> None:
    assert {r for r, _ in BAD} == set(REASONS)


def test_rejection_detail_never_echoes_the_value() -> None:
    for _, raw in BAD:
        got = parse_input(raw, S, NOW)
        assert isinstance(got, Rejection)
        assert "1.5" not in got.detail and "signupz" not in got.detail


def test_valid_events() -> None:
    assert parse_input(b'{"counter":"signups","ts":1767225600000}', S, NOW) == ValidEvent(
        "signups", NOW, UNIT)  # value defaults to 1
    got = parse_input(b'{"counter":"signups","ts":"2026-01-01T00:00:00.123Z","value":0.5}',
                      S, NOW)
    assert got == ValidEvent("signups", NOW + 123, UNIT // 2)
    got = parse_input(b'{"counter":"signups","ts":"2026-01-01T01:00:00+01:00","value":0}',
                      S, NOW)
    assert got == ValidEvent("signups", NOW, 0)
    # Exactly max_future_ms ahead is still accepted; the declared start itself is accepted.
    assert isinstance(parse_input(b'{"counter":"signups","ts":1767225660000}', S, NOW),
                      ValidEvent)
    assert isinstance(parse_input(b'{"counter":"signups","ts":1767222000000}', S, NOW),
                      ValidEvent)


def test_undeclared_counter_with_option() -> None:
    s = with_overrides(S, allow_undeclared=True)
    assert parse_input(b'{"counter":"new","ts":1767225600000}', s, NOW) == ValidEvent(
        "new", NOW, UNIT)


def test_timeline_roundtrip_and_errors() -> None:
    assert decode_timeline(encode_event("a", 123, 7)) == TimelineEvent("a", 123, 7)
    assert decode_timeline(encode_marker(99)) == TimelineMarker(99)
    assert encode_event("a", 123, 7) == b'{"k":"e","c":"a","ts":123,"v":7}'
    assert encode_marker(-1) == b'{"k":"m","n":-1}'
    assert ValidEvent("a", 5, 9).to_timeline() == encode_event("a", 5, 9)
    for bad in (b"x", b"[]", b'{"k":"q"}', b'{"k":"m"}', b'{"k":"m","n":true}',
                b'{"k":"e","c":"a","ts":1}', b'{"k":"e","c":"a","ts":1,"v":65537}',
                b'{"k":"e","c":"","ts":1,"v":1}', b'{"k":"e","c":"a","ts":-1,"v":1}'):
        with pytest.raises(TimelineFormatError):
            decode_timeline(bad)


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


def test_schema_file_matches_parser() -> None:
    """The JSON schema documents the same fields and bounds as parse_input."""
    schema = json.loads((Path(__file__).parents[2] / "schemas" /
                         "input-event.schema.json").read_text())
    assert set(schema["properties"]) == {"counter", "ts", "value"}
    assert schema["required"] == ["counter", "ts"]
    assert schema["additionalProperties"] is False
    v = schema["properties"]["value"]
    assert (v["minimum"], v["maximum"], v["default"]) == (0, 1, 1)
