"""A release encoded from its `ReleaseTemplate` (an idle counter's heartbeat:
`Operator._beat_idle`) is published exactly as the Release it stands for: its value is
`Release.to_json` byte for byte, and its key, headers and timestamp are the Release's.
Random releases (fixed seed) over the values orjson formats differently from Python
(integers as floats, negative zero, tiny and huge floats, subnormals, ints as floats'
fields, unicode and escaped counter names); controls that must be caught: a template
that drops a field, and one that formats a float as Python does. Then the operator's own
heartbeats of idle counters, against the Releases decoded from them re-encoded and a run
that keeps every counter decoded; and on a real broker, the worker's sink publishing an
encoded release as its Release."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import string
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer

from processor.stream.kafka.producer import AsyncProducer, KafkaSink
from processor.stream.model import records
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, TopicSettings
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output, Sink
from processor.stream.model.records import (
    EncodedRelease,
    Release,
    ReleaseTemplate,
    encode_marker,
)
from processor.stream.model.state import DictStore
from tests.conftest import create_topics, unique_topic
from tests.stream.test_commit import batches_of
from tests.stream.test_operator import KEY, random_timeline, settings, to_records

_SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, 2.0, 1e16, 1e17, 1.5e300, -1.7976931348623157e308,
                   5e-324, -5e-324, 2.2250738585072014e-308, 1e-7, 1e-6, 1e-5, 0.1, 0.3,
                   123456789.0, 1e21, 1e22, 0.05, 100.0, 1e-300, 9007199254740993.0)


def _float(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.3:
        return rng.choice(_SPECIAL_FLOATS)
    if pick < 0.5:
        return float(rng.randint(-10**6, 10**6))  # integers as floats
    if pick < 0.7:
        return rng.uniform(-1.0, 1.0) * 10.0 ** rng.randint(-320, 305)
    return rng.uniform(-1000.0, 1000.0)


def _name(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits + '-_."\\/ é€😀\u2028\x7f'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))


def _fields(rng: random.Random) -> dict[str, Any]:
    """Every field of a Release but counter and value, at random."""
    return {
        "tick": rng.randint(1, 10**9),
        "tick_start_ms": rng.randint(0, 2**62),
        "tick_ms": rng.choice((1, 1000, 60_000, 86_400_000)),
        "kind": rng.choice(("heartbeat", "change")),
        "mechanism": rng.choice(("ecc", "simecc", "binary-tree", "mécanisme")),
        # Parameters may be ints where a configuration wrote them so.
        "epsilon": rng.choice((_float(rng), 1, 2)),
        "delta": rng.choice((_float(rng), 0)),
        "error_bound": _float(rng),
        "beta": _float(rng),
        "fingerprint": rng.choice(("", f"{rng.getrandbits(64):016x}", _name(rng))),
    }


def _cases(n: int) -> list[tuple[dict[str, Any], list[tuple[str, float]]]]:
    rng = random.Random(32)
    return [(_fields(rng), [(_name(rng), _float(rng)) for _ in range(20)])
            for _ in range(n)]


def _disagreements(make: Any, cases: list[tuple[dict[str, Any], list[tuple[str, float]]]]
                   ) -> int:
    """How many records `make(**fields)`'s `release` publishes differently from Release."""
    bad = 0
    for fields, rows in cases:
        template = make(**fields)
        for counter, value in rows:
            got = template.release(counter, value)
            want = Release(counter=counter, value=value, **fields)
            if (got.to_json(), got.key(), got.headers(), got.timestamp_ms()) != (
                    want.to_json(), want.key(), want.headers(), want.timestamp_ms()):
                bad += 1
    return bad


def test_template_release_is_release_to_json() -> None:
    cases = _cases(500)  # 10,000 records
    assert _disagreements(ReleaseTemplate, cases) == 0
    for fields, rows in cases[:50]:
        template = ReleaseTemplate(**fields)
        for counter, value in rows:
            got = template.release(counter, value)
            want = Release(counter=counter, value=value, **fields)
            assert got.decoded() == want
            assert (got.counter, got.tick, got.kind) == (want.counter, want.tick, want.kind)


def test_control_a_dropped_field_is_caught() -> None:
    """A template whose tail lacks the beta field (what a template written by hand
    would lose when Release gains or reorders a field)."""

    class Dropping(ReleaseTemplate):
        __slots__ = ()

        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            beta = b',"beta":' + orjson.dumps(fields["beta"])
            assert self._tail.count(beta) == 1
            self._tail = self._tail.replace(beta, b"")

    assert _disagreements(Dropping, _cases(50)) == 50 * 20


def test_control_python_float_formatting_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The value formatted as Python's repr (1e-06, 1e+16, inf) instead of orjson's
    (1e-6, 1e16): caught on such values, while json.dumps-equal ones pass."""
    monkeypatch.setattr(records, "_dumps", lambda v: (
        repr(v).encode() if isinstance(v, float) else orjson.dumps(v)))
    cases = _cases(100)
    bad = _disagreements(ReleaseTemplate, cases)
    differ = sum(repr(v).encode() != orjson.dumps(v) for _f, rows in cases for _c, v in rows)
    assert bad == differ > 50


def test_a_placeholder_in_a_field_is_refused() -> None:
    fields = _fields(random.Random(1))
    fields["fingerprint"] = records._VALUE_SLOT
    with pytest.raises(ValueError):
        ReleaseTemplate(**fields)


class _Encoded(Sink):
    """Keeps the operator's releases as given (a CollectingSink decodes them)."""

    def __init__(self) -> None:
        self.releases: list[Release | EncodedRelease] = []

    def send(self, out: Output) -> None:
        self.releases.extend(out.releases)

    async def flush(self) -> None:
        return None


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_operator_heartbeats_of_idle_counters(mechanism: str) -> None:
    """Every counter released as idle (idle_decoded = 0), heartbeats spread: the
    operator's encoded heartbeats are those of their Releases, and a run that keeps every
    counter decoded publishes the same bytes in the same order."""
    names = [f"k{i:02d}" for i in range(30)] + ["ünïcode:名前/ø"]
    s = settings(dict.fromkeys(names, 100 * 1000), mechanism=mechanism, epsilon=0.7,
                 heartbeat_ticks=7, heartbeat_spread=True)

    def run(idle_decoded: int) -> list[Release | EncodedRelease]:
        rng = random.Random(3)
        records_ = to_records(random_timeline(rng, names[:5], 100, 300, 0.08), 4)
        records_.append(encode_marker(400))
        sink = _Encoded()
        bc = BatchCommit(Operator(s, KEY, idle_decoded=idle_decoded), DictStore(), sink)
        for batch in batches_of(records_, rng):
            asyncio.run(bc.apply(0, batch))
            if rng.random() < 0.3:
                asyncio.run(bc.checkpoint(full=False))
        return sink.releases

    idle, decoded = run(0), run(1 << 14)
    encoded = [r for r in idle if isinstance(r, EncodedRelease)]
    assert len(encoded) > 500 and all(r.kind == "heartbeat" for r in encoded)
    assert any(r.counter == names[-1] for r in encoded)
    assert not any(isinstance(r, EncodedRelease) for r in decoded)
    for r in encoded:
        ref = r.decoded()
        assert (r.to_json(), r.key(), r.headers(), r.timestamp_ms()) == (
            ref.to_json(), ref.key(), ref.headers(), ref.timestamp_ms())
    assert [(r.key(), r.to_json(), r.headers(), r.timestamp_ms()) for r in idle] == [
        (r.key(), r.to_json(), r.headers(), r.timestamp_ms()) for r in decoded]


def test_kafka_sink_publishes_encoded_releases_as_their_releases(
        kafka_bootstrap: str) -> None:
    """On a real broker: the worker's sink sends each release twice, once as its Release
    and once encoded from a template; the two records read back have the same key,
    value, headers and timestamp."""
    topic = unique_topic("release-template")
    create_topics(kafka_bootstrap, [topic])
    s = dataclasses.replace(Settings(), topics=dataclasses.replace(TopicSettings(),
                                                                   counts=topic))
    rng = random.Random(7)
    out = Output()
    for fields, rows in _cases(20):
        template = ReleaseTemplate(**fields)
        for counter, value in rows[:3]:
            out.releases.append(Release(counter=counter, value=value, **fields))
            out.releases.append(template.release(counter, value))
    rng.shuffle(out.releases)  # the kinds interleaved, in whatever order
    producer = AsyncProducer({"bootstrap.servers": kafka_bootstrap})
    try:
        KafkaSink(producer, s, lambda _n, _k: None, ()).send(out)
        asyncio.run(producer.flush())
    finally:
        producer.close()
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got: list[tuple[Any, ...]] = []
    try:
        consumer.subscribe([topic])
        for _ in range(600):
            if len(got) >= len(out.releases):
                break
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got.append((msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
    finally:
        consumer.close()
    assert len(got) == len(out.releases) == 120
    want = sorted(((r.key(), r.to_json(), r.headers(), r.timestamp_ms())
                   for r in out.releases), key=repr)
    assert sorted(got, key=repr) == want
    # Every record twice: its Release's and its template's, byte for byte.
    assert all(want[i] == want[i + 1] for i in range(0, len(want), 2))


class _ByEquality(ReleaseTemplate):
    """Control: the bytes after the counter kept per equal value (0.0 == -0.0 == 0), not
    per value object as `ReleaseTemplate.release` keeps them."""

    __slots__ = ("_by_value",)

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self._by_value: dict[float, bytes] = {}

    def release(self, counter: str, value: float) -> EncodedRelease:
        rest = self._by_value.get(value)
        if rest is None:
            rest = self._by_value[value] = b"".join(
                (self._middle, orjson.dumps(value), self._tail))
        return EncodedRelease(counter, self, b"".join(
            (self._head, orjson.dumps(counter), rest)))


def test_a_repeated_value_object_and_its_equals_encode_as_their_releases() -> None:
    """A template keeps the bytes after the counter for the last value object it was
    given (a marker's idle counters share one zero): the same object again, and values
    equal to it but written otherwise (-0.0, an int 0, 1 against 1.0), each publish what
    their Release does; `stamped` is what the sink sends of each. Control: kept per
    equal value, the -0.0 and the ints are caught."""
    zero, one = 0.0, 1.0
    values: list[Any] = [zero, zero, -0.0, 0, zero, one, 1, one, float("inf"), zero]
    rng = random.Random(9)
    rows = [(_name(rng), v) for v in values]
    cases = [(_fields(rng), rows) for _ in range(20)]
    assert _disagreements(ReleaseTemplate, cases) == 0
    for fields, rows_ in cases:
        template = ReleaseTemplate(**fields)
        for counter, value in rows_:
            got = template.release(counter, value)
            want = Release(counter=counter, value=value, **fields)
            assert got.stamped() == want.stamped() == (
                want.key(), want.to_json(), want.timestamp_ms(), want.headers())
    # -0.0 after 0.0, 0 after -0.0 (equal: the control's dict holds 0.0's), 1 after 1.0
    assert _disagreements(_ByEquality, cases) == 3 * 20
