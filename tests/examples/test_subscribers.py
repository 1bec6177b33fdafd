"""The example subscribers (examples/python, examples/java) against the real broker, on
releases the project's own worker published (its one sink, KafkaSink):
each must end with the current private value of every counter, the one with the largest
tick, and reject a record without schema_version.

The topic also gets two foreign records after the worker stops: a release without
schema_version for counter "a" at tick 10^9 (the control: a subscriber that did not check
the version would report it as a's current value) and a schema_version 2 record with an
unknown field for a counter "future" (the compatibility policy: a version-1 reader reads
later versions, ignoring what it does not know).

Plus, without a broker: the Python subscriber's y_t, rebuilt from a sparse stream (a
heartbeat every 50 ticks), equals the operator's y at every tick (a record at every tick).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.records import Event, Release, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from tests.conftest import in_ci
from tests.stream.helpers import apply_now

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TICK = 100
FORGED_TICK = 10**9


def _python_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_subscriber",
                                                  EXAMPLES / "python" / "subscriber.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def _releases(heartbeat_ticks: int) -> list[Release]:
    s = with_overrides(Settings(), counters={"a": 0}, tick_ms=1000, mechanism="simecc",
                       epsilon=10.0, heartbeat_ticks=heartbeat_ticks,
                       heartbeat_spread=False, partitions=1)
    op, store = Operator(s, NoiseKey(bytes(range(32)))), DictStore()
    out = apply_now(op, store, 0, 0, encode_batch([Event("a", i, UNIT, 0, i) for i in range(300)]))
    releases = out.decoded_releases()
    releases += apply_now(op, store, 0, 1, encode_marker(399)).decoded_releases()
    return releases


def test_python_subscriber_rebuilds_y_at_every_tick() -> None:
    """The rebuild rule of the schema: y_t is the value of the record with the largest tick
    <= t. From the sparse stream (re-sent once, out of order, as after a crash) the
    subscriber's y_at(t) equals the dense stream's value at every t. Control: the rule
    "the record with the smallest tick >= t" gets some tick wrong."""
    dense = {r.tick: r.value for r in _releases(1)}
    sparse = _releases(50)
    assert sorted(dense) == list(range(1, 401))
    assert any(r.kind == "change" for r in sparse)  # y moves: the rule matters
    assert len(sparse) < len(dense) // 5
    sub = _python_example().Subscriber()
    for r in sparse + sparse[: len(sparse) // 2]:
        assert sub.apply(r.to_json(), r.headers()) is not None or r in sparse
    assert sub.rejected == 0
    assert all(sub.y_at("a", t) == dense[t] for t in dense)
    assert sub.current["a"].tick == 400 and sub.current["a"].value == dense[400]
    assert sub.y_at("a", 401) is None  # beyond the newest record: not known yet
    ticks = sorted(r.tick for r in sparse)

    def next_rule(t: int) -> float:
        nxt = min(k for k in ticks if k >= t)
        return next(r.value for r in sparse if r.tick == nxt)
    assert any(next_rule(t) != dense[t] for t in dense)


# ------------------------------------------------------------------- against the broker

@pytest.fixture(scope="module")
def published(kafka_bootstrap: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A short worker run (3 counters, 2 partitions, 100 ms ticks), stopped, then the two
    foreign records; yields the topic and the state a subscriber must end with."""
    from processor.devtools.deployment import isolated_deployment

    start = (int(time.time() * 1000) // TICK - 20) * TICK
    d = isolated_deployment(kafka_bootstrap, {"a": start, "b": start, "quiet": start},
                            parent=tmp_path_factory.mktemp("subscribers"), name="subs",
                            partitions=2, tick_ms=TICK, lateness_ms=300,
                            max_future_ms=10_000, heartbeat_ticks=5,
                            heartbeat_spread=False, mechanism="simecc", epsilon=10.0)
    try:
        d.worker.start()
        now = int(time.time() * 1000)
        d.produce([orjson.dumps({"counter": "a", "ts": now + 10 * i}) for i in range(40)]
                  + [orjson.dumps({"counter": "b", "ts": now, "value": 0.5})])
        d.wait_releases(lambda rs: all(sum(r["counter"] == c for r in rs) >= 3
                                       for c in ("a", "b", "quiet")), timeout_s=90)
        assert d.worker.stop() == 0, d.worker.log_tail()
    finally:
        d.close()
    worker_records = list(kafka_io.iter_topic(d.conf, d.topics.counts))
    good = orjson.loads(worker_records[0].value or b"")
    unversioned = {k: v for k, v in good.items() if k != "schema_version"}
    foreign = [(b"a", orjson.dumps(dict(unversioned, counter="a", tick=FORGED_TICK,
                                        value=12345.0))),
               (b"future", orjson.dumps(dict(good, schema_version=2, counter="future",
                                             tick=7, value=1.5, new_field="ignored")))]
    kafka_io.produce_all(d.conf, d.topics.counts, foreign)
    expected: dict[str, dict[str, Any]] = {}
    for raw in [r.value or b"" for r in worker_records] + [v for _, v in foreign]:
        doc = orjson.loads(raw)
        if type(doc.get("schema_version")) is not int:
            continue
        c = doc["counter"]
        if c not in expected or expected[c]["tick"] < doc["tick"]:
            expected[c] = {k: doc[k] for k in ("tick", "value", "error_bound", "beta")}
    yield {"bootstrap": kafka_bootstrap, "topic": d.topics.counts, "records": worker_records,
           "expected": expected, "total": len(worker_records) + len(foreign)}


def test_every_release_carries_the_contracts_headers(published: dict[str, Any]) -> None:
    records = published["records"]
    assert records
    for r in records:
        assert r.header("content-type") == b"application/json"
        assert r.header("schema") == b"private-count/1"
        assert orjson.loads(r.value or b"")["schema_version"] == 1


def _check_summary(stdout: str, published: dict[str, Any]) -> None:
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["rejected"] == 1, summary  # the release without schema_version
    assert summary["records"] == published["total"]
    assert summary["counters"] == published["expected"]
    assert set(summary["counters"]) == {"a", "b", "quiet", "future"}
    assert summary["counters"]["a"]["tick"] < FORGED_TICK


def test_python_subscriber(published: dict[str, Any]) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "python" / "subscriber.py"), "--bootstrap-servers",
         published["bootstrap"], "--topic", published["topic"], "--until-end"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "rejected a record: no schema_version >= 1" in proc.stderr
    _check_summary(proc.stdout, published)


def _java_toolchain() -> Path:
    """examples/java/target/lib, fetched by the repo's own step (examples/java/fetch-deps.sh,
    which deploy/setup.sh runs); without java or mvn: a failure in CI, else a skip."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not on PATH (the Java example needs Java 17, Maven)"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    proc = subprocess.run(["bash", str(EXAMPLES / "java" / "fetch-deps.sh")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return EXAMPLES / "java" / "target" / "lib"


def test_java_subscriber(published: dict[str, Any]) -> None:
    lib = _java_toolchain()
    proc = subprocess.run(
        ["java", "-cp", f"{lib}/*", str(EXAMPLES / "java" / "Subscriber.java"),
         "--bootstrap-servers", published["bootstrap"], "--topic", published["topic"],
         "--until-end"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "rejected a record: no schema_version >= 1" in proc.stderr
    _check_summary(proc.stdout, published)


def test_python_subscriber_follows_a_key_that_appears_while_it_runs() -> None:
    """An open family's key is published from its admission tick on: the subscriber
    picks the new counter up, y_at before its first record is None (not published; a
    declared counter's is 0), and after it the published values. Pure: the operator's
    records, fed as they come."""
    from processor.stream.model.families import OpenFamily

    s = with_overrides(Settings(), counters={"a": 0}, tick_ms=1, mechanism="simecc",
                       epsilon=200.0, heartbeat_ticks=50, heartbeat_spread=False,
                       partitions=1, families={"pages": OpenFamily(0, 1e-7)})
    op, store = Operator(s, NoiseKey(bytes(range(32)))), DictStore()
    sub = _python_example().Subscriber()
    offset = 0
    seen_before_key = False
    for n in range(600):
        recs = [encode_batch([Event("pages[k]", n, UNIT, 0, n)]), encode_marker(n)]
        for rec in recs:
            for r in apply_now(op, store, 0, offset, rec).releases:
                assert sub.apply(r.to_json(), r.headers()) is not None
            offset += 1
        seen_before_key |= "a" in sub.current and "pages[k]" not in sub.current
    assert seen_before_key and "pages[k]" in sub.current  # it appeared while running
    first = min(t for t, _y in sub.history["pages[k]"])
    assert first > 1 and sub.y_at("pages[k]", first - 1) is None
    assert sub.y_at("a", 1) == 0.0
    assert sub.y_at("pages[k]", first) == sub.history["pages[k]"][0][1] > 50
