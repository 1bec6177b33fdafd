"""Wire formats of the stream layer: input events, timeline records, releases, ledger
entries and dead letters (one home for every record the processor reads or writes).

- `parse_input` turns one raw input record into an `Event` or a `Rejection` with a
  machine-readable reason. It never raises: every record either counts or goes to the
  dead-letter topic.
- Timeline records (the internal, partitioned log the operator consumes), version 2, are
  small orjson objects:
    event batch: {"v":2,"k":"b","e":[[counter, ts_ms, units, src_partition, src_offset], ...]}
    marker:      {"v":2,"k":"m","n":tick}   ("sealed through global tick n")
  One batch carries many events of one timeline partition, each with the input partition
  and offset it came from (the operator's duplicate filter needs them). The timeline is
  internal: a record of any other version is a TimelineFormatError.
- `Release` (the private-count topic) and `LedgerEntry` (the privacy ledger topic): the
  public records, public quantities only. Each carries its `schema_version` (the first
  field of its JSON) and names its Kafka headers (`headers()`: content type and schema),
  the downstream contract of docs/downstream.md and schemas/.
- `partition_for(counter, P)` is the stable counter -> timeline partition map;
  `sealed_through(now_ms, settings)` the marker the leader's timer appends.

Rejection details name the rule that failed, never the rejected value: details may reach
logs, while the raw bytes go only to the (private) dead-letter topic.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeVar, cast

import orjson

from processor.core.grid import GRID_BITS, UNIT, to_units
from processor.errors import StreamError
from processor.stream.model.config import MAX_COUNTER_NAME, Settings
from processor.stream.model.families import key_counter, key_problem
from processor.stream.model.lifetime import UnitClaim
from processor.stream.model.lifetime import plain as plain_claim

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
    # privacy_unit = "user" (docs/privacy-unit.md): no unit id, a bad one, and an event
    # beyond a contribution bound (the bounding stage's, processor/stream/model/bounding.py).
    "unit_missing",
    "invalid_unit",
    "contribution_bound_exceeded",
    # Open families (families.py): an event of one without a key, a bad key, and a key
    # given to a counter that is not an open family.
    "key_missing",
    "invalid_key",
)
#: The reasons only a privacy_unit = "user" deployment gives (an event-mode record is
#: never rejected for them).
USER_MODE_REASONS: Final = ("unit_missing", "contribution_bound_exceeded")
#: The reasons only a deployment with open families gives (families.py).
OPEN_FAMILY_REASONS: Final = ("key_missing", "invalid_key")
#: The input field naming the privacy unit, and its longest accepted value (UTF-8 bytes).
UNIT_FIELD: Final = "user"
MAX_UNIT_ID: Final = 256
#: The input field naming an open family's key (families.py).
KEY_FIELD: Final = "key"
#: The dead-letter record keeps at most this many bytes of the original record.
DEADLETTER_RAW_LIMIT = 4096
#: The version of the timeline records this module writes (and the only one it reads).
TIMELINE_VERSION: Final = 2
#: A timeline batch record carries at most this many events ...
MAX_BATCH_EVENTS: Final = 5000
#: ... and at most this many bytes (under the 1 MB default record size limits of the
#: broker, librdkafka's producer and Faust's consumer fetch).
MAX_BATCH_BYTES: Final = 900_000
#: The schema versions of the public records (schemas/private-count.schema.json and
#: schemas/ledger-entry.schema.json). A version only ever adds fields; the compatibility
#: policy is in docs/downstream.md.
RELEASE_SCHEMA_VERSION: Final = 1
LEDGER_SCHEMA_VERSION: Final = 1
#: Ledger entries of a privacy_unit = "user" deployment: version 1 plus the unit fields.
#: Event-mode entries stay version 1, byte for byte.
LEDGER_UNIT_SCHEMA_VERSION: Final = 2
#: Kafka headers of every public record: what a subscriber reads before the value.
Headers = list[tuple[str, bytes]]


def _headers(schema: str, version: int) -> tuple[tuple[str, bytes], ...]:
    return (("content-type", b"application/json"),
            ("schema", f"{schema}/{version}".encode("ascii")))


RELEASE_HEADERS: Final = _headers("private-count", RELEASE_SCHEMA_VERSION)
LEDGER_HEADERS: Final = _headers("ledger-entry", LEDGER_SCHEMA_VERSION)
LEDGER_UNIT_HEADERS: Final = _headers("ledger-entry", LEDGER_UNIT_SCHEMA_VERSION)
_INPUT_FIELDS = frozenset({"counter", "ts", "value", UNIT_FIELD, KEY_FIELD})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimelineFormatError(StreamError, ValueError):
    """A timeline record that is not one this module writes (corrupt, foreign or v1)."""

    error_prefix = "timeline: "


@dataclass(frozen=True, slots=True)
class Event:
    """A validated input event: counter, event time (epoch ms), value in grid units
    (0..UNIT), and the input partition and offset it was read from (-1 when unknown:
    such an event bypasses the duplicate filter)."""

    counter: str
    ts_ms: int
    units: int
    src_partition: int = -1
    src_offset: int = -1
    #: The privacy unit's id (the input's "user" field) in privacy_unit = "user" mode,
    #: else None. Raw: ingest replaces it by its keyed hash before anything is written.
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input record cannot be counted: `reason` is one of REASONS, `detail` a
    human-readable sentence without the rejected value."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class TimelineBatch:
    """A timeline record carrying events of one partition, in the order ingest read them."""

    events: tuple[Event, ...]
    #: The input topic's identity the events' input offsets belong to ("" if the record
    #: does not name one): a topic deleted and recreated under the same name restarts its
    #: offsets, and is a new source for the operator's duplicate filter.
    source: str = ""


@dataclass(frozen=True, slots=True)
class TimelineMarker:
    """'Every tick with global index <= sealed_through is sealed.'"""

    sealed_through: int


@dataclass(frozen=True, slots=True)
class Release:
    """One published value of one counter at one tick (the private-count topic).

    `value` is y_t; `error_bound` bounds |y_t - s_t| with probability >= 1 - beta and is
    computed from public quantities only. Keyed and idempotent by (counter, tick).
    """

    #: Declared first so it leads the JSON (orjson writes fields in declaration order);
    #: keyword-only, so the positional fields are unchanged.
    schema_version: int = field(default=RELEASE_SCHEMA_VERSION, kw_only=True)
    counter: str
    tick: int
    tick_start_ms: int
    tick_ms: int
    value: float
    kind: Literal["change", "heartbeat"]
    mechanism: str
    epsilon: float
    delta: float
    error_bound: float
    beta: float
    fingerprint: str

    def key(self) -> bytes:
        return self.counter.encode("utf-8")

    def to_json(self) -> bytes:
        # orjson serialises dataclasses in field order: deterministic bytes.
        return orjson.dumps(self)

    def headers(self) -> Headers:
        return list(RELEASE_HEADERS)

    def timestamp_ms(self) -> int:
        """The Kafka record timestamp: the end of its tick, a function of public fields.
        The send time would move with the time to apply the batch, which grows with the
        private events in it (docs/operator-channels.md, the residual timing channel)."""
        return self.tick_start_ms + self.tick_ms

    def stamped(self) -> tuple[bytes, bytes, int, Headers]:
        """(key, value, timestamp, headers) as the sink produces it."""
        return self.key(), self.to_json(), self.timestamp_ms(), self.headers()


class ReleaseTemplate:
    """The JSON of the releases that differ only in counter and value: `Release.to_json`
    of one whose counter and value are placeholders, cut at them. orjson writes a
    dataclass as its fields' own JSON in declaration order, so a release's bytes are the
    cut pieces with orjson.dumps of its counter and of its value between them
    (`release`): Release.to_json stays the one rule of a release's bytes, and
    tests/stream/test_release_template.py checks the two agree. An idle worker's marker
    writes a heartbeat per idle counter this way (`Operator._beat_idle`), without a Release
    object and its encoding per record (docs/state.md, idle counters)."""

    __slots__ = ("_head", "_middle", "_rest", "_tail", "_value", "headers", "kind", "tick",
                 "timestamp")

    def __init__(self, **fields: Any) -> None:
        """`fields`: every field of a Release but counter and value (schema_version may be
        left to its default)."""
        probe = Release(counter=_COUNTER_SLOT, value=_VALUE_SLOT, **fields)  # type: ignore[arg-type]
        raw = probe.to_json()
        counter, value = orjson.dumps(_COUNTER_SLOT), orjson.dumps(_VALUE_SLOT)
        if raw.count(counter) != 1 or raw.count(value) != 1:
            raise ValueError("a release field holds a template's placeholder")
        head, rest = raw.split(counter)
        middle, tail = rest.split(value)
        self._head, self._middle, self._tail = head, middle, tail
        # The bytes after the counter for the last value object given (`release`): the
        # same object, the same bytes (a marker's idle counters share one zero).
        self._value: object = _VALUE_SLOT
        self._rest = b""
        self.tick: int = probe.tick
        self.kind: Literal["change", "heartbeat"] = probe.kind
        self.timestamp: int = probe.timestamp_ms()
        self.headers: Headers = probe.headers()

    def release(self, counter: str, value: float) -> EncodedRelease:
        """The release of `counter` with `value` and this template's other fields."""
        if value is not self._value:
            self._rest = b"".join((self._middle, _dumps(value), self._tail))
            self._value = value
        return EncodedRelease(counter, self, b"".join((self._head, _dumps(counter), self._rest)))


#: The placeholders of a template's counter and value: no other field of a release holds
#: them (mechanism names, hex fingerprints; checked where a template is made).
_COUNTER_SLOT: Final = "\x00release-template:counter\x00"
_VALUE_SLOT: Final = "\x00release-template:value\x00"
#: One field's JSON as orjson writes it inside a dataclass (tests swap it for controls).
_dumps: Callable[[Any], bytes] = orjson.dumps


class EncodedRelease:
    """A release held as the bytes it is published as (`ReleaseTemplate.release`): what a
    sink sends of a Release (key, value, headers, timestamp), without the object.
    `decoded()` is the Release itself (what a CollectingSink keeps)."""

    __slots__ = ("_json", "_template", "counter")

    def __init__(self, counter: str, template: ReleaseTemplate, raw: bytes) -> None:
        self.counter = counter
        self._template = template
        self._json = raw

    @property
    def tick(self) -> int:
        return self._template.tick

    @property
    def kind(self) -> Literal["change", "heartbeat"]:
        return self._template.kind

    def key(self) -> bytes:
        return self.counter.encode("utf-8")

    def to_json(self) -> bytes:
        return self._json

    def headers(self) -> Headers:
        return list(self._template.headers)

    def timestamp_ms(self) -> int:
        return self._template.timestamp

    def stamped(self) -> tuple[bytes, bytes, int, Headers]:
        """(key, value, timestamp, headers) as the sink produces it: the headers are the
        template's own list, shared by its records (the producer only reads them)."""
        t = self._template
        return self.counter.encode("utf-8"), self._json, t.timestamp, t.headers

    def decoded(self) -> Release:
        return Release(**orjson.loads(self._json))


#: A release as a stage's Output holds it.
AnyRelease = Release | EncodedRelease


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """The privacy ledger record of one counter, written by the marker that creates its
    state (never at an event: the ledger is public, and an entry written at a counter's
    first event would reveal that event's time)."""

    #: First in the JSON, keyword-only (as in Release).
    schema_version: int = field(default=LEDGER_SCHEMA_VERSION, kw_only=True)
    counter: str
    mechanism: str
    epsilon: float
    delta: float
    tick_ms: int
    start_ms: int
    privacy_unit: str = "one event"
    contribution_bound: int = 1
    fingerprint: str = ""
    grid_bits: int = GRID_BITS
    #: The public fingerprint of the noise key (`identity.key_fingerprint`), never the key.
    key_id: str = ""
    #: The public tag of this creation of the counter (`identity.creation_tag`): a
    #: restarted worker re-creates an announced counter only under the same tag.
    creation: str = ""
    #: "created" (the counter's first entry, at the marker that creates it) or
    #: "reconfigured" (the configuration fingerprint changed under its existing state:
    #: written before its first release under the new fingerprint).
    entry: Literal["created", "reconfigured"] = "created"
    #: The counter's local tick from which its releases carry this entry's fingerprint.
    since_tick: int = 1
    #: "configured": mechanism, epsilon and delta are those the configuration gives a new
    #: counter; "stored": the counter continues under its stored ones, which differ
    #: (on_parameter_change = "keep"). Never fresh ones: that would republish its ticks.
    parameters: Literal["configured", "stored"] = "configured"
    #: Which analysis calibrates the counter's noise: "paper" or "tight" (the project's
    #: own, docs/tight-calibration.md); the same (epsilon, delta) either way.
    calibration: str = "paper"
    #: privacy_unit = "user" only (schema version 2; None and absent from the JSON in
    #: event mode): the input field naming the unit, the bound on counters per unit
    #: (contribution_bound above is then the bound on events per counter), the guarantee
    #: per unit, and how epsilon/delta (per event) were derived from it.
    unit_field: str | None = None
    max_counters_per_unit: int | None = None
    unit_epsilon: float | None = None
    unit_delta: float | None = None
    unit_derivation: str | None = None
    #: Every user-mode entry of a deployment that has or had an open family in user mode
    #: (absent from the JSON otherwise): the delta per unit of the whole published
    #: output, the admissions of the m keys a unit may touch included, unit_delta +
    #: (1 + e^unit_epsilon) m D, D the largest delta0 any family's gate ever used or will
    #: use (lifetime.UnitClaim.delta_total, docs/open-keys.md); unit_epsilon is unchanged.
    unit_delta_total: float | None = None

    def key(self) -> bytes:
        return self.counter.encode("utf-8")

    def to_json(self) -> bytes:
        if self.unit_field is None:
            # Event mode: exactly the version-1 bytes (the unit fields left out).
            return orjson.dumps({k: getattr(self, k) for k in _LEDGER_V1_FIELDS})
        if self.unit_delta_total is None:
            # No family, ever: exactly the version-2 bytes it always had.
            return orjson.dumps({k: getattr(self, k) for k in _LEDGER_V2_FIELDS})
        return orjson.dumps(self)

    def headers(self) -> Headers:
        if self.schema_version >= LEDGER_UNIT_SCHEMA_VERSION:
            return list(LEDGER_UNIT_HEADERS)
        return list(LEDGER_HEADERS)

    def timestamp_ms(self) -> int:
        """The Kafka record timestamp: the end of tick `since_tick` (for a created entry,
        of the counter's first tick), a function of public fields as for releases."""
        return self.start_ms + self.since_tick * self.tick_ms


_LEDGER_UNIT_FIELDS: Final = ("unit_field", "max_counters_per_unit", "unit_epsilon",
                               "unit_delta", "unit_derivation", "unit_delta_total")
_LEDGER_V1_FIELDS: Final = tuple(f for f in LedgerEntry.__dataclass_fields__
                                 if f not in _LEDGER_UNIT_FIELDS)
_LEDGER_V2_FIELDS: Final = tuple(f for f in LedgerEntry.__dataclass_fields__
                                 if f != "unit_delta_total")


def unit_ledger_fields(settings: Settings, claim: UnitClaim | None = None) -> dict[str, Any]:
    """The LedgerEntry keyword arguments of the privacy unit: none in event mode (the
    entry is what it always was), the unit, both bounds and the guarantee per unit in
    user mode: `claim` (what holds over the deployment's life, lifetime.unit_claim), by
    default what the configuration alone derives; beside an open family, ever, also the
    total with the gate's term (for declared counters and keys alike)."""
    if claim is None:
        claim = plain_claim(settings)
    if claim is None:
        return {}
    return {"schema_version": LEDGER_UNIT_SCHEMA_VERSION, "privacy_unit": "user",
            "contribution_bound": claim.max_events_per_counter, "unit_field": UNIT_FIELD,
            "max_counters_per_unit": claim.max_counters_per_unit,
            "unit_epsilon": claim.unit_epsilon, "unit_delta": claim.unit_delta,
            "unit_derivation": claim.derivation, "unit_delta_total": claim.delta_total()}


def announced_in(objects: Iterable[dict[str, Any]]) -> dict[str, frozenset[str]]:
    """What a ledger topic announced, from its entries decoded once (`lifetime.
    ledger_objects`, which skips tombstones and foreign records): counter -> the creation
    tags of its entries (the Operator's `announced`). A counter's entry without a tag
    (written before tags existed) counts with the tag "", which no creation matches:
    announced, so never re-created."""
    got = Announced()
    for obj in objects:
        got.add(obj)
    return got.tags


class Announced:
    """`announced_in`, entry by entry: `add` each decoded entry (or let them pass through
    `passing` on their way to another reader), then read `tags`."""

    def __init__(self) -> None:
        self.tags: dict[str, frozenset[str]] = {}
        # Nearly every counter has one tag, and all of them the same: one shared set per
        # tag (a worker holds as many counters as the ledger has entries).
        self._alone: dict[str, frozenset[str]] = {}

    def add(self, obj: dict[str, Any]) -> None:
        tag = obj.get("creation")
        if type(tag) is not str:
            tag = ""
        name = obj["counter"]
        tags = self.tags.get(name)
        if tags is None:
            alone = self._alone.get(tag)
            if alone is None:
                alone = self._alone[tag] = frozenset((tag,))
            self.tags[name] = alone
        elif tag not in tags:
            self.tags[name] = tags | {tag}

    def passing(self, objects: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each of `objects`, added on its way."""
        for obj in objects:
            self.add(obj)
            yield obj


def partition_for(counter: str, partitions: int) -> int:
    """The timeline partition of `counter`: first 8 bytes of sha256(name), big-endian,
    mod `partitions`. Stable across processes and Python versions (no hash seed)."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    digest = hashlib.sha256(counter.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


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


def parse_input(raw: bytes, settings: Settings, now_ms: int, partition: int = -1,
                offset: int = -1) -> Event | Rejection:
    """Validate one input record (schemas/input-event.schema.json) at wall clock `now_ms`;
    `partition` and `offset` (where it was read) travel with the event.

    Checks, in order: JSON, object shape and field types, counter name encodable as UTF-8
    and not too long, timestamp present, value finite and in [0, 1] (default 1), counter
    declared, timestamp not beyond now + max_future_ms, timestamp not before the counter's
    start. Never raises: an unexpected exception is a schema_violation.
    """
    return _parse_input(raw, settings, now_ms, partition, offset, True)


def parse_input_reference(raw: bytes, settings: Settings, now_ms: int, partition: int = -1,
                          offset: int = -1) -> Event | Rejection:
    """`parse_input` without its fast path (`_plain_event`): every check in turn. The
    reference the fast path must agree with (tests/stream/test_records.py)."""
    return _parse_input(raw, settings, now_ms, partition, offset, False)


def _parse_input(raw: bytes, settings: Settings, now_ms: int, partition: int, offset: int,
                 fast: bool) -> Event | Rejection:
    """`parse_input`, with its plain-event fast path if `fast`."""
    try:
        try:
            obj = _loads(bytes(raw))
        except (ValueError, UnicodeDecodeError, RecursionError, TypeError):
            return Rejection("unparsable", "not a UTF-8 JSON document")
        # Most events are plain: taken at a third of the full checks' cost. (A plain
        # name's start is >= 0, so ts >= start implies the full checks' ts >= 0.)
        return ((fast and _plain_event(obj, settings, now_ms, partition, offset))
                or _checked_input(obj, settings, now_ms, partition, offset))
    except Exception as exc:  # a bad record must never stop the ingest loop
        return Rejection("schema_violation", f"not a valid event ({type(exc).__name__})")


#: The last `_plain_names`: its settings and their map.
_PLAIN: tuple[Settings, Mapping[str, int] | None] | None = None


def _plain_names(settings: Settings) -> Mapping[str, int] | None:
    """The declared counters whose events `_plain_event` may take, with their starts: the
    names `_input_counter` accepts that are no open family's (whose events need a key).
    None in user mode (every event needs its unit checked). Made once per settings."""
    global _PLAIN
    got = _PLAIN
    if got is None or got[0] is not settings:
        names = None if settings.privacy_unit == "user" else {
            name: start for name, start in settings.counters.items()
            if type(start) is int and start >= 0 and name not in settings.families
            and _input_counter(name) == name}
        got = _PLAIN = (settings, names)
    return got[1]


#: Grid units of the values an event usually has (0 and the default 1): `to_units`'.
_PLAIN_UNITS: Final = (to_units(0), to_units(1))


def _plain_event(obj: Any, settings: Settings, now_ms: int, partition: int,
                 offset: int) -> Event | None:
    """The common event, taken without the full checks: a JSON object of exactly a
    declared counter (`_plain_names`), an integer ts >= 0 within the counter's start and
    max_future_ms, and optionally an integer value 0 or 1. It is valid, and the Event is
    the one `_checked_input` makes of it (tests/stream/test_records.py checks that they
    agree); anything else is None, for the full checks to take or reject."""
    if type(obj) is not dict:
        return None
    names = _plain_names(settings)
    if names is None:
        return None
    counter = obj.get("counter")
    if type(counter) is not str:
        return None
    start = names.get(counter)
    ts = obj.get("ts")
    value = obj.get("value", 1)
    if (start is None or type(ts) is not int or type(value) is not int
            or not 0 <= value <= 1 or len(obj) != 2 + ("value" in obj)
            or not start <= ts <= now_ms + settings.max_future_ms):
        return None
    return Event(counter, ts, _PLAIN_UNITS[value], partition, offset)


def _checked_input(obj: Any, settings: Settings, now_ms: int, partition: int,
                   offset: int) -> Event | Rejection:
    if not isinstance(obj, dict):
        return Rejection("schema_violation", "an event must be a JSON object")
    extra = set(obj) - _INPUT_FIELDS
    if extra:
        return Rejection("schema_violation",
                         "unknown field(s); allowed: counter, ts, value, user, key")
    named = _input_name(obj, settings)
    if isinstance(named, Rejection):
        return named
    counter, start = named
    unit = _input_unit(obj.get(UNIT_FIELD), settings)
    if isinstance(unit, Rejection):
        return unit
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
    if start is None and not settings.allow_undeclared:
        return Rejection("undeclared_counter", "counter is not declared in the configuration")
    if ts > now_ms + settings.max_future_ms:
        return Rejection("timestamp_too_far_in_future",
                         f"ts is more than max_future_ms={settings.max_future_ms} ahead")
    if start is not None and ts < start:
        return Rejection("before_start", "ts is before the counter's declared start")
    units = to_units(value)
    if not 0 <= units <= UNIT:
        return Rejection("value_out_of_range", "value must be in [0, 1]")
    return Event(counter, ts, units, partition, offset, unit)


def _input_name(obj: dict[str, Any], settings: Settings) -> tuple[str, int | None] | Rejection:
    """The counter an event counts into (a declared or undeclared counter's name, or an
    open family's key's counter, families.py) and its start (None: undeclared)."""
    counter = _input_counter(obj.get("counter"))
    if isinstance(counter, Rejection):
        return counter
    family = settings.families.get(counter)
    key = _input_key(obj.get(KEY_FIELD), family is not None)
    if isinstance(key, Rejection):
        return key
    if family is None or key is None:
        return counter, settings.counters.get(counter)
    return key_counter(counter, key), family.start_ms


def _input_key(key: object, open_family: bool) -> str | Rejection | None:
    """The event's key: required for an open family's counter, refused for any other."""
    if not open_family:
        if key is None:
            return None
        return Rejection("schema_violation", f"{KEY_FIELD} is only accepted for an open family")
    if key is None:
        return Rejection("key_missing", f"{KEY_FIELD} is required for an open family")
    problem = key_problem(key)
    if problem is not None:
        return Rejection("invalid_key", problem)
    return cast(str, key)  # key_problem found it a string


def _input_counter(counter: object) -> str | Rejection:
    if not isinstance(counter, str) or not counter:
        return Rejection("schema_violation", "counter must be a non-empty string")
    try:
        # Strict: a lone surrogate ("\ud800", valid JSON) cannot be a Kafka key, a state
        # key or an orjson string later on, so it is rejected here, not crashed on there.
        name_bytes = len(counter.encode("utf-8"))
    except UnicodeEncodeError:
        return Rejection("schema_violation", "counter is not valid Unicode text")
    if name_bytes > MAX_COUNTER_NAME:
        return Rejection("schema_violation", f"counter longer than {MAX_COUNTER_NAME} bytes")
    return counter


def _input_unit(unit: object, settings: Settings) -> str | Rejection | None:
    """The event's privacy unit id: required in user mode, checked whenever present,
    dropped (None) in event mode."""
    if unit is None:
        if settings.privacy_unit == "user":
            return Rejection("unit_missing", f"{UNIT_FIELD} is required (privacy_unit = user)")
        return None
    problem = unit_id_problem(unit)
    if problem is not None:
        return Rejection("invalid_unit", problem)
    if settings.privacy_unit != "user":
        return None  # event mode: accepted by the schema, not used
    return cast(str, unit)  # unit_id_problem found it a string


def unit_id_problem(unit: object) -> str | None:
    """Why `unit` cannot name a privacy unit (the rule, never the value), or None: a
    non-empty string of at most MAX_UNIT_ID bytes of UTF-8 (no lone surrogates)."""
    if not isinstance(unit, str):
        return f"{UNIT_FIELD} must be a string"
    if not unit:
        return f"{UNIT_FIELD} must not be empty"
    try:
        n = len(unit.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{UNIT_FIELD} is not valid Unicode text"
    if n > MAX_UNIT_ID:
        return f"{UNIT_FIELD} longer than {MAX_UNIT_ID} bytes"
    return None


class DeadLetterEncoder:
    """The dead-letter value for a rejected input record (`deadletter_record`), for any
    number of records of one rejection read from one topic: what they share (reason,
    detail, topic) is encoded once, since a units record may reject most of its events.
    The only place raw input may appear (base64, truncated to 4 KiB): the dead-letter
    topic is private. The bytes are orjson's of {"reason", "detail", "raw", "truncated",
    "topic", "partition", "offset"} in that order."""

    __slots__ = ("_head", "_tails")

    def __init__(self, rejection: Rejection, topic: str) -> None:
        head = orjson.dumps({"reason": rejection.reason, "detail": rejection.detail})
        self._head = head[:-1] + b',"raw":"'
        rest = b',"topic":' + orjson.dumps(topic) + b',"partition":'
        #: by whether the raw value was truncated
        self._tails = (b'","truncated":false' + rest, b'","truncated":true' + rest)

    def __call__(self, raw: bytes, partition: int, offset: int) -> bytes:
        return b"".join((self._head,
                         binascii.b2a_base64(bytes(raw[:DEADLETTER_RAW_LIMIT]), newline=False),
                         self._tails[len(raw) > DEADLETTER_RAW_LIMIT],
                         b'%d,"offset":%d}' % (partition, offset)))


def deadletter_record(rejection: Rejection, raw: bytes, topic: str, partition: int,
                      offset: int) -> bytes:
    """The dead-letter value for one rejected input record (DeadLetterEncoder)."""
    return DeadLetterEncoder(rejection, topic)(raw, partition, offset)


# ------------------------------------------------------------------------ timeline


def encode_batch(events: Sequence[Event], source: str = "") -> bytes:
    """Timeline bytes of one batch of validated events (one timeline partition's), read
    from the input topic whose identity is `source` ("" : not named)."""
    return encode_batch_rows(
        [[e.counter, e.ts_ms, e.units, e.src_partition, e.src_offset] for e in events], source)


_Row = TypeVar("_Row")


def fit_records(rows: Sequence[_Row], encode: Callable[[Sequence[_Row]], bytes],
                max_events: int = MAX_BATCH_EVENTS,
                max_bytes: int = MAX_BATCH_BYTES) -> list[bytes]:
    """`rows` as records, in order: at most `max_events` rows each, and a record longer
    than `max_bytes` halved (order kept) until it fits or holds one row."""
    out: list[bytes] = []

    def fit(part: Sequence[_Row]) -> None:
        data = encode(part)
        if len(data) <= max_bytes or len(part) == 1:
            out.append(data)
            return
        half = len(part) // 2
        fit(part[:half])
        fit(part[half:])

    for i in range(0, len(rows), max_events):
        fit(rows[i:i + max_events])
    return out


def encode_batch_rows(rows: Sequence[Sequence[Any]], source: str = "") -> bytes:
    """encode_batch of events given as rows [counter, ts_ms, units, src_partition,
    src_offset] (a caller that has them as rows builds no Event)."""
    if source:
        return orjson.dumps({"v": TIMELINE_VERSION, "k": "b", "i": source, "e": rows})
    return orjson.dumps({"v": TIMELINE_VERSION, "k": "b", "e": rows})


def encode_marker(sealed_through_tick: int) -> bytes:
    """Timeline bytes of a 'sealed through global tick n' marker."""
    return orjson.dumps({"v": TIMELINE_VERSION, "k": "m", "n": sealed_through_tick})


#: How every marker's bytes begin (`encode_marker`: orjson keeps the dict's order).
_MARKER_PREFIX: Final = b'{"v":%d,"k":"m"' % TIMELINE_VERSION


def marker_tick(raw: bytes | None) -> int | None:
    """n of a well-formed marker record, else None; event batches (which can be large)
    are told apart by their first bytes, without decoding them."""
    if not raw or not raw.startswith(_MARKER_PREFIX):
        return None
    try:
        rec = decode_timeline(raw)
    except TimelineFormatError:
        return None
    return rec.sealed_through if isinstance(rec, TimelineMarker) else None


#: One validated event of a batch record, as decoded: [counter, ts_ms, units,
#: src_partition, src_offset] (the fields of Event, in order).
EventRow = list[Any]


class EventRows(list[EventRow]):
    """The rows of one batch record, and the input topic identity they were read under
    (`source`, "" if the record names none)."""

    __slots__ = ("source",)

    def __init__(self, rows: list[EventRow], source: str = "") -> None:
        super().__init__(rows)
        self.source = source


def source_label(source: str, partition: int) -> str:
    """The duplicate filter's name of input partition `partition` of the input topic
    whose identity is `source`."""
    return f"{source}/{partition}" if source else str(partition)


def decode_timeline(raw: bytes) -> TimelineBatch | TimelineMarker:
    """Parse one timeline record; TimelineFormatError if it is not a well-formed v2 record."""
    rec = decode_timeline_rows(raw)
    if isinstance(rec, TimelineMarker):
        return rec
    return TimelineBatch(tuple(Event(*row) for row in rec), rec.source)


def decode_timeline_rows(raw: bytes) -> EventRows | TimelineMarker:
    """decode_timeline without an Event object per event (the operator's hot path): a
    batch record's validated rows, each [counter, ts_ms, units, src_partition, src_offset]."""
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        raise TimelineFormatError("timeline record is not JSON") from None
    if type(obj) is not dict:
        raise TimelineFormatError("timeline record is not an object")
    if obj.get("v") != TIMELINE_VERSION or type(obj.get("v")) is not int:
        raise TimelineFormatError("timeline record is not version 2")
    kind = obj.get("k")
    source = obj.get("i", "")
    if kind == "b" and len(obj) == 3 + ("i" in obj):
        rows = obj.get("e")
        if type(rows) is not list:
            raise TimelineFormatError("timeline batch lacks e")
        if type(source) is not str or len(source) > 64 or ("i" in obj and not source):
            raise TimelineFormatError("timeline batch has a malformed input identity")
        # Inline (no call per row): exact type checks, since bool is an int subclass and
        # orjson yields exact types only.
        for row in rows:
            if type(row) is not list or len(row) != 5:
                raise TimelineFormatError(
                    "timeline event is not [c, ts, units, partition, offset]")
            c, ts, units, sp, so = row
            if (type(c) is not str or not c or type(ts) is not int or type(units) is not int
                    or type(sp) is not int or type(so) is not int):
                raise TimelineFormatError("timeline event has a field of the wrong type")
            if ts < 0 or not 0 <= units <= UNIT or sp < -1 or so < -1:
                raise TimelineFormatError("timeline event out of range")
        return EventRows(rows, source)
    if kind == "m" and len(obj) == 3:
        n = obj.get("n")
        if type(n) is not int:
            raise TimelineFormatError("timeline marker lacks n")
        return TimelineMarker(n)
    raise TimelineFormatError("unknown timeline record kind")

