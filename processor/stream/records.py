"""Wire formats of the stream layer: input validation, timeline records, dead letters.

- `parse_input` turns one raw input record into a `ValidEvent` or a `Rejection` with a
  machine-readable reason. It never raises on bad bytes: every record either counts or
  goes to the dead-letter topic.
- Timeline records (the internal, partitioned log the operator consumes) are small orjson
  objects: {"k":"e","c":counter,"ts":ms,"v":units} for an event and {"k":"m","n":tick}
  for a "sealed through global tick n" marker.
- `partition_for(counter, P)` is the stable counter -> timeline partition map.

Rejection details name the rule that failed, never the rejected value: details may reach
logs, while the raw bytes go only to the (private) dead-letter topic.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from processor.core.grid import UNIT, to_units
from processor.stream.config import MAX_COUNTER_NAME, Settings

#: Every reason code a Rejection may carry (the dead-letter "reason" field).
REASONS: Final = (
    "unparsable",
    "schema_violation",
    "value_out_of_range",
    "value_not_finite",
    "undeclared_counter",
    "timestamp_missing",
    "timestamp_too_far_in_future",
    "before_start",
)
#: The dead-letter record keeps at most this many bytes of the original record.
DEADLETTER_RAW_LIMIT = 4096
_INPUT_FIELDS = frozenset({"counter", "ts", "value"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimelineFormatError(ValueError):
    """A timeline record that is not one this module writes (corrupt or foreign)."""


@dataclass(frozen=True, slots=True)
class ValidEvent:
    """An input event that passed validation: counter, event time (epoch ms) and value
    in grid units (0..UNIT)."""

    counter: str
    ts_ms: int
    value_units: int

    def to_timeline(self) -> bytes:
        return encode_event(self.counter, self.ts_ms, self.value_units)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input record cannot be counted: `reason` is one of REASONS, `detail` a
    human-readable sentence without the rejected value."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """A validated event on the timeline (value in grid units)."""

    counter: str
    ts_ms: int
    value_units: int


@dataclass(frozen=True, slots=True)
class TimelineMarker:
    """'Every tick with global index <= sealed_through is sealed.'"""

    sealed_through: int


# ------------------------------------------------------------------------ partitioning


def partition_for(counter: str, partitions: int) -> int:
    """The timeline partition of `counter`: first 8 bytes of sha256(name), big-endian,
    mod `partitions`. Stable across processes and Python versions (no hash seed)."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    digest = hashlib.sha256(counter.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def global_tick(ts_ms: int, tick_ms: int) -> int:
    """The global tick an event time falls in: [n*tick_ms, (n+1)*tick_ms)."""
    return ts_ms // tick_ms


def sealed_through(now_ms: int, settings: Settings) -> int:
    """The marker the leader's timer should append at wall-clock `now_ms`: tick n is
    sealed once its end plus the allowed lateness has passed."""
    return (now_ms - settings.lateness_ms) // settings.tick_ms - 1


# ------------------------------------------------------------------------ input


def _loads(raw: bytes) -> Any:
    """orjson first (fast, strict); stdlib json as a fallback only so that NaN, Infinity
    and 1e400 (which orjson refuses) are reported as value_not_finite, not unparsable."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    text = raw.decode("utf-8")  # UnicodeDecodeError is handled by the caller
    return json.loads(text)


def _parse_ts(v: object) -> int | Rejection:
    if isinstance(v, bool):
        return Rejection("schema_violation", "ts must be epoch milliseconds or ISO-8601")
    if isinstance(v, int):
        if v < 0:
            return Rejection("schema_violation", "ts must be >= 0 (epoch milliseconds)")
        return v
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v)
        except ValueError:
            return Rejection("schema_violation", "ts string is not ISO-8601")
        if dt.tzinfo is None:
            return Rejection("schema_violation", "ts string needs a time zone (e.g. Z)")
        # Exact integer arithmetic: no float rounding of the millisecond.
        delta = dt - _EPOCH
        total = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
        if total < 0:
            return Rejection("schema_violation", "ts must not be before 1970")
        return total
    return Rejection("schema_violation", "ts must be epoch milliseconds or ISO-8601")


def parse_input(raw: bytes, settings: Settings, now_ms: int) -> ValidEvent | Rejection:
    """Validate one input record (schemas/input-event.schema.json) at wall clock `now_ms`.

    Checks, in order: JSON, object shape and field types, timestamp present, value finite
    and in [0, 1] (default 1), counter declared, timestamp not beyond now + max_future_ms,
    timestamp not before the counter's start. Never raises.
    """
    try:
        obj = _loads(bytes(raw))
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError):
        return Rejection("unparsable", "not a UTF-8 JSON document")
    if not isinstance(obj, dict):
        return Rejection("schema_violation", "an event must be a JSON object")
    extra = set(obj) - _INPUT_FIELDS
    if extra:
        return Rejection("schema_violation", "unknown field(s); allowed: counter, ts, value")
    counter = obj.get("counter")
    if not isinstance(counter, str) or not counter:
        return Rejection("schema_violation", "counter must be a non-empty string")
    if len(counter.encode("utf-8", "surrogatepass")) > MAX_COUNTER_NAME:
        return Rejection("schema_violation", f"counter longer than {MAX_COUNTER_NAME} bytes")
    if "ts" not in obj or obj["ts"] is None:
        return Rejection("timestamp_missing", "ts is required")
    ts = _parse_ts(obj["ts"])
    if isinstance(ts, Rejection):
        return ts
    value = obj.get("value", 1)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return Rejection("schema_violation", "value must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        return Rejection("value_not_finite", "value must be finite")
    if value < 0 or value > 1:
        return Rejection("value_out_of_range", "value must be in [0, 1]")
    start = settings.counters.get(counter)
    if start is None and not settings.allow_undeclared:
        return Rejection("undeclared_counter", "counter is not declared in the configuration")
    if ts > now_ms + settings.max_future_ms:
        return Rejection("timestamp_too_far_in_future",
                         f"ts is more than max_future_ms={settings.max_future_ms} ahead")
    if start is not None and ts < start:
        return Rejection("before_start", "ts is before the counter's declared start")
    units = to_units(value)
    assert 0 <= units <= UNIT
    return ValidEvent(counter, ts, units)


def deadletter_record(rejection: Rejection, raw: bytes, topic: str, partition: int,
                      offset: int) -> bytes:
    """The dead-letter value for a rejected input record. The only place raw input may
    appear (base64, truncated to 4 KiB): the dead-letter topic is private."""
    return orjson.dumps({
        "reason": rejection.reason,
        "detail": rejection.detail,
        "raw": base64.b64encode(bytes(raw[:DEADLETTER_RAW_LIMIT])).decode("ascii"),
        "truncated": len(raw) > DEADLETTER_RAW_LIMIT,
        "topic": topic,
        "partition": partition,
        "offset": offset,
    })


# ------------------------------------------------------------------------ timeline


def encode_event(counter: str, ts_ms: int, value_units: int) -> bytes:
    """Timeline bytes of one validated event."""
    return orjson.dumps({"k": "e", "c": counter, "ts": ts_ms, "v": value_units})


def encode_marker(sealed_through_tick: int) -> bytes:
    """Timeline bytes of a 'sealed through global tick n' marker."""
    return orjson.dumps({"k": "m", "n": sealed_through_tick})


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode_timeline(raw: bytes) -> TimelineEvent | TimelineMarker:
    """Parse one timeline record; TimelineFormatError if it is not well formed."""
    try:
        obj = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        raise TimelineFormatError("timeline record is not JSON") from None
    if not isinstance(obj, dict):
        raise TimelineFormatError("timeline record is not an object")
    kind = obj.get("k")
    if kind == "e":
        c, ts, v = obj.get("c"), obj.get("ts"), obj.get("v")
        if not isinstance(c, str) or not c or not _is_int(ts) or not _is_int(v):
            raise TimelineFormatError("timeline event lacks c/ts/v")
        assert isinstance(ts, int) and isinstance(v, int)
        if ts < 0 or not 0 <= v <= UNIT:
            raise TimelineFormatError("timeline event out of range")
        return TimelineEvent(c, ts, v)
    if kind == "m":
        n = obj.get("n")
        if not _is_int(n):
            raise TimelineFormatError("timeline marker lacks n")
        assert isinstance(n, int)
        return TimelineMarker(n)
    raise TimelineFormatError("unknown timeline record kind")
