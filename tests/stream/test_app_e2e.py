"""End-to-end tests of the Faust worker on a real Kafka broker.

The worker runs as a child process (`python -m processor worker --config F`), exactly as
deployed. Tests wait for records with a deadline (never sleep to synchronise), then stop the
worker and check what it published against two references:

- the pure Operator run over the same timeline topic (`replay.replay`), and
- an independent re-derivation from the written spec: events go to max(event tick, first
  open tick); each tick the arrivals join a FIFO queue and at most one event leaves as x_t;
  a fresh core counter steps through x_1, x_2, ... and a record is due when y changes or at
  every heartbeat tick. That is what `python -m processor count` computes on the implied
  tick sequence.

Helpers here are imported by test_crash.py and test_replay.py.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from processor.core import registry
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.devtools.deployment import Deployment, write_config
from processor.keyfile import read_key, write_key
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.operator import is_heartbeat_tick
from processor.stream.model.records import (
    OPEN_FAMILY_REASONS,
    REASONS,
    USER_MODE_REASONS,
    Event,
    TimelineBatch,
    TimelineMarker,
    decode_timeline,
    partition_for,
)
from processor.stream.replay import ReplayReport, replay

TEST_SECRET = hashlib.sha256(b"h7 e2e test noise key (public, tests only)").digest()


def now_ms() -> int:
    return int(time.time() * 1000)


#: One test deployment (settings, config file, key, worker process, client config): the
#: project's isolated deployment, the same the demo and the benchmark build.
Live = Deployment

#: The e2e settings: short ticks so that tests see many of them, heartbeats at fixed ticks.
E2E_SETTINGS: Final = dict(partitions=2, tick_ms=100, lateness_ms=300, max_future_ms=10_000,
                           heartbeat_ticks=10, heartbeat_spread=False, epsilon=1.0,
                           delta=1e-6)


@pytest.fixture
def live_factory(deployment_factory: Callable[..., Deployment]) -> Callable[..., Live]:
    """`factory(counters, name=..., **settings)`: an isolated deployment on the session
    broker with the e2e settings and the test key (topics created, worker not started;
    every worker stopped at teardown)."""
    def factory(counters: Mapping[str, int], *, name: str = "e2e", **overrides: Any) -> Live:
        return deployment_factory(dict(counters), name=name, secret=TEST_SECRET,
                                  **{**E2E_SETTINGS, **overrides})

    return factory


def implied_ticks(settings: Settings, timeline: Mapping[int, list[kafka_io.KafkaRecord]]
                  ) -> dict[str, list[float | None]]:
    """Per counter, the input x_1, x_2, ... the design implies for this timeline.

    Per partition, in offset order: a marker raises the partition's sealed frontier; an
    event (first copy of each input offset only) joins tick max(ts // tick, frontier + 1).
    Per counter, tick by tick up to the final frontier: arrivals join a FIFO queue and at
    most one leaves as x_t (else None, i.e. ⊥).
    """
    tick = settings.tick_ms
    starts = {c: s // tick for c, s in settings.counters.items()}
    arrivals: dict[str, dict[int, list[int]]] = {c: {} for c in starts}
    final: dict[int, int] = {}
    for p, recs in timeline.items():
        frontier = -1
        seen: dict[int, int] = {}
        for r in sorted(recs, key=lambda r: r.offset):
            rec = decode_timeline(r.value or b"")
            if isinstance(rec, TimelineMarker):
                frontier = max(frontier, rec.sealed_through)
                continue
            for ev in rec.events:
                if ev.src_offset <= seen.get(ev.src_partition, -1):
                    continue  # a copy re-sent by ingest after a crash
                seen[ev.src_partition] = ev.src_offset
                g = max(ev.ts_ms // tick, frontier + 1, starts[ev.counter])
                arrivals[ev.counter].setdefault(g, []).append(ev.units)
        final[p] = frontier
    out: dict[str, list[float | None]] = {}
    for c, start in starts.items():
        through = final.get(partition_for(c, settings.partitions), -1)
        queue: deque[int] = deque()
        xs: list[float | None] = []
        for g in range(start, through + 1):
            queue.extend(arrivals[c].get(g, []))
            xs.append(queue.popleft() / UNIT if queue else None)
        out[c] = xs
    return out


def timeline_events(timeline: Mapping[int, list[kafka_io.KafkaRecord]]
                    ) -> list[tuple[int, int, Event]]:
    """Every event in the timeline's batch records: (timeline partition, record offset,
    event), copies re-sent by ingest included, in partition then offset order."""
    out: list[tuple[int, int, Event]] = []
    for p in sorted(timeline):
        for r in sorted(timeline[p], key=lambda r: r.offset):
            rec = decode_timeline(r.value or b"")
            if isinstance(rec, TimelineBatch):
                out.extend((p, r.offset, ev) for ev in rec.events)
    return out


def spec_expectation(settings: Settings, key: NoiseKey,
                     timeline: Mapping[int, list[kafka_io.KafkaRecord]]
                     ) -> dict[tuple[str, int, str], float]:
    """Releases re-derived from the written design, independently of the Operator code:
    a fresh core counter steps through the implied x_t; a change record when y moves, a
    heartbeat at is_heartbeat_tick ticks otherwise."""
    out: dict[tuple[str, int, str], float] = {}
    for c, xs in implied_ticks(settings, timeline).items():
        counter = registry.make(settings.mechanism, settings.epsilon, settings.delta, key,
                                counter_id(noise_identity(settings, key), c))
        last = 0.0
        for t, x in enumerate(xs, start=1):
            y = counter.update(x)
            if y != last:
                out[(c, t, "change")] = y
            elif is_heartbeat_tick(settings, c, t):
                out[(c, t, "heartbeat")] = y
            last = y
    return out


def count_cli_changes(settings: Settings, key_file: str, counter: str,
                      xs: list[float | None], tmp: Path) -> dict[int, float]:
    """`python -m processor count --changes` on the implied tick file: t -> y where y moved."""
    ticks = tmp / f"{counter}.ticks"
    ticks.write_text("".join("_\n" if x is None else f"{x!r}\n" for x in xs))
    res = subprocess.run(
        [sys.executable, "-m", "processor", "count", "--mechanism", settings.mechanism,
         "--epsilon", repr(settings.epsilon), "--delta", repr(settings.delta),
         "--key-file", key_file,
         "--counter-id", counter_id(noise_identity(settings, read_key(key_file)), counter),
         "--changes", "--input", str(ticks)],
        capture_output=True, check=True, cwd=str(Path(__file__).resolve().parents[2]))
    rows = [orjson.loads(line) for line in res.stdout.splitlines() if line.strip()]
    out: dict[int, float] = {}
    last = 0.0
    for r in rows:
        if r["y"] != last:
            out[int(r["t"])] = float(r["y"])
        last = r["y"]
    return out


def published_map(releases: Iterable[dict[str, Any]]) -> dict[tuple[str, int, str], float]:
    """(counter, tick, kind) -> value; fails on two different values for one key."""
    out: dict[tuple[str, int, str], float] = {}
    for r in releases:
        k = (str(r["counter"]), int(r["tick"]), str(r["kind"]))
        assert out.get(k, r["value"]) == r["value"], f"{k} published with two values"
        out[k] = float(r["value"])
    return out


def assert_matches_operator(live: Live) -> ReplayReport:
    """replay(): the published stream equals the pure Operator on the same timeline (every
    release of a committed timeline record published, everything published identical)."""
    report = replay(live.settings, live.key)
    assert report.identical, report.summary()
    return report


def committed_prefix(live: Live) -> dict[int, list[kafka_io.KafkaRecord]]:
    """The timeline records the worker has committed (all their releases are published)."""
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    done = kafka_io.committed_offsets(live.conf, live.settings.app_id, live.topics.timeline)
    return {p: [r for r in rs if r.offset < done.get(p, 0)] for p, rs in timeline.items()}


def bad_records(counter: str, start_ms: int, now: int) -> dict[str, bytes]:
    """One input record for every dead-letter reason."""
    return {
        "unparsable": b"\xff\xfe this is not json",
        "schema_violation": orjson.dumps({"counter": counter, "ts": now, "colour": "red"}),
        "value_out_of_range": orjson.dumps({"counter": counter, "ts": now, "value": 1.5}),
        "value_not_finite": b'{"counter": "%s", "ts": %d, "value": NaN}' % (
            counter.encode(), now),
        "undeclared_counter": orjson.dumps({"counter": "nobody-declared-me", "ts": now}),
        "timestamp_missing": orjson.dumps({"counter": counter, "value": 1}),
        "timestamp_too_far_in_future": orjson.dumps({"counter": counter, "ts": now + 600_000}),
        "before_start": orjson.dumps({"counter": counter, "ts": start_ms - 5_000}),
        "invalid_unit": orjson.dumps({"counter": counter, "ts": now, "user": 5}),
    }


# --------------------------------------------------------------------------- the tests


@pytest.mark.kafka
def test_known_sequence_matches_operator_spec_and_dead_letters(
        live_factory: Callable[..., Live]) -> None:
    """A known event sequence (bursts, future-dated ticks, late events) and one bad record of
    every kind: the worker publishes exactly the Operator's releases on the same timeline,
    which equal the spec re-derivation; every bad record is in the dead-letter topic with its
    reason, its raw bytes and its source offset; an idle counter releases its heartbeats on
    time. Control: the spec re-derivation with a wrong tick assignment (late events at their
    own, already sealed tick) no longer matches."""
    tick = 100
    start = (now_ms() // tick) * tick - 20 * tick
    # SimECC with a large epsilon: checkpoints every few ticks, so the values move with the
    # data and a wrong tick assignment shows up in them.
    live = live_factory({"alpha": start, "beta": start, "idle": start},
                        mechanism="simecc", epsilon=500.0)
    live.worker.start()
    # Markers are flowing once anything is released; from then on old ticks are sealed.
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    now = now_ms()
    valid: list[bytes] = []
    valid += [orjson.dumps({"counter": "alpha", "ts": now + 1500}) for _ in range(30)]  # burst
    valid += [orjson.dumps({"counter": "beta", "ts": now + 1000 + 100 * k, "value": 0.5})
              for k in range(20)]
    valid += [orjson.dumps({"counter": "alpha", "ts": start + 3 * tick}) for _ in range(5)]  # late
    bad = bad_records("alpha", start, now)
    live.produce(valid + list(bad.values()))
    end_tick = (now + 1500 + 45 * tick) // tick - start // tick + 1
    live.wait_releases(lambda rs: any(r["counter"] == "idle" and r["tick"] >= end_tick
                                      for r in rs), timeout_s=90)
    assert live.worker.stop() == 0, live.worker.log_tail()

    report = assert_matches_operator(live)
    # Every public record's Kafka timestamp is the end of its tick (public fields), never
    # the send time, which moves with the private events of the batch.
    def tick_end(d: dict[str, Any]) -> int:
        if "since_tick" in d:  # a ledger entry
            return int(d["start_ms"] + d["since_tick"] * d["tick_ms"])
        return int(d["tick_start_ms"] + d["tick_ms"])

    for topic in (live.topics.counts, live.topics.ledger):
        recs = list(kafka_io.iter_topic(live.conf, topic))
        assert recs and all(r.timestamp_ms == tick_end(orjson.loads(r.value or b""))
                            for r in recs)
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    prefix = committed_prefix(live)
    published = published_map(live.releases())
    expected = spec_expectation(live.settings, live.key, prefix)
    assert report.recomputed == len(expected)
    assert {k: v for k, v in published.items() if k in expected} == expected
    assert any(k[0] == "beta" and k[2] == "change" for k in expected)
    assert any(k[0] == "alpha" and k[1] >= end_tick - 10 for k in expected)
    # ... which is what `python -m processor count` gives on the implied tick sequence.
    xs = implied_ticks(live.settings, prefix)
    assert sum(x or 0 for x in xs["alpha"]) == 35 and sum(x or 0 for x in xs["beta"]) == 10
    for c in ("alpha", "beta"):
        cli = count_cli_changes(live.settings, str(live.settings.noise_key_file), c, xs[c],
                                Path(str(live.config)).parent)
        assert cli == {k[1]: v for k, v in expected.items() if k[0] == c and k[2] == "change"}

    # Every valid event is on the timeline exactly once, in its counter's partition.
    events = timeline_events(timeline)
    got = Counter((ev.counter, ev.ts_ms, ev.units) for p, _o, ev in events
                  if p == partition_for(ev.counter, live.settings.partitions))
    want: Counter[tuple[str, int, int]] = Counter()
    for v in valid:
        d = orjson.loads(v)
        want[(d["counter"], d["ts"], round(d.get("value", 1) * UNIT))] += 1
    assert got == want

    # Dead letters: one per reason, with raw bytes and the input coordinates.
    inputs = {r.value: r for r in kafka_io.iter_topic(live.conf, live.topics.input)}
    dead = [orjson.loads(r.value or b"") for r in
            kafka_io.iter_topic(live.conf, live.topics.deadletter)]
    assert sorted(d["reason"] for d in dead) == sorted(
        set(REASONS) - set(USER_MODE_REASONS) - set(OPEN_FAMILY_REASONS))
    for d in dead:
        raw = base64.b64decode(d["raw"])
        assert raw == bad[d["reason"]]
        src = inputs[raw]
        assert (d["topic"], d["partition"], d["offset"]) == (live.topics.input, src.partition,
                                                             src.offset)

    # The idle counter: a record at every 10th tick at least (a heartbeat, or a change at
    # one of SimECC's data-independent checkpoints), each published soon after its tick was
    # due (end + lateness); only ticks due after the worker was up are timed.
    idle = [r for r in kafka_io.iter_topic(live.conf, live.topics.counts) if r.key == b"idle"]
    rel = [(orjson.loads(r.value or b""), r.timestamp_ms) for r in idle]
    ticks = {d["tick"] for d, _ in rel}
    assert max(ticks) >= end_tick
    assert set(range(10, max(ticks) + 1, 10)) <= ticks
    first_seen = min(ts for _, ts in rel)
    for d, ts in rel:
        due = d["tick_start_ms"] + d["tick_ms"] + live.settings.lateness_ms
        if due > first_seen + 1000:
            assert ts - due < 3000, f"heartbeat {d['tick']} published {ts - due} ms late"

    # Control: a spec variant that keeps late events at their own (sealed) tick differs.
    wrong = spec_expectation(live.settings, live.key, _strip_markers(prefix))
    assert {k: v for k, v in published.items() if k in wrong} != wrong


def _strip_markers(timeline: Mapping[int, list[kafka_io.KafkaRecord]]
                   ) -> dict[int, list[kafka_io.KafkaRecord]]:
    """The timeline with markers moved to the end: every event keeps its own tick."""
    out: dict[int, list[kafka_io.KafkaRecord]] = {}
    for p, recs in timeline.items():
        evs = [r for r in recs if b'"k":"m"' not in (r.value or b"")]
        mks = [r for r in recs if b'"k":"m"' in (r.value or b"")]
        n = len(recs)
        moved = [kafka_io.KafkaRecord(r.topic, r.partition, n + i, r.key, r.value, r.headers,
                                      r.timestamp_ms) for i, r in enumerate(mks)]
        out[p] = evs + moved
    return out


@pytest.mark.kafka
def test_thousand_counters_one_worker(live_factory: Callable[..., Live]) -> None:
    """1,000 declared counters on one worker: every counter gets its ledger entry and its
    heartbeats, events reach the right counters, and the published stream equals the
    Operator's on the same timeline."""
    tick = 200
    start = (now_ms() // tick) * tick
    names = [f"c{i:04d}" for i in range(1000)]
    live = live_factory(dict.fromkeys(names, start), name="e2e-1k", partitions=4,
                        tick_ms=tick, lateness_ms=400)
    live.worker.start()
    now = now_ms()
    live.produce(orjson.dumps({"counter": names[(7 * i) % 1000], "ts": now + 1500})
                 for i in range(3000))
    target = (now + 5000) // tick - start // tick + 1

    def all_past(rs: list[dict[str, Any]]) -> bool:
        hb: dict[str, int] = {}
        for r in rs:
            hb[r["counter"]] = max(hb.get(r["counter"], 0), r["tick"])
        return len(hb) == 1000 and min(hb.values()) >= target

    live.wait_releases(all_past, timeout_s=120)
    assert live.worker.stop() == 0, live.worker.log_tail()
    ledger = {r.key for r in kafka_io.iter_topic(live.conf, live.topics.ledger)}
    assert ledger == {n.encode() for n in names}
    assert_matches_operator(live)
    # Published: every counter past the target tick (committed ones were all checked).
    assert len(published_map(live.releases())) >= 1000 * (target // 10)
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    assert len(timeline_events(timeline)) == 3000


def _worker_start_error(settings: Settings, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cfg = write_config(settings, tmp_path / "start-error.toml")
    return subprocess.run(
        [sys.executable, "-m", "processor", "worker", "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]))


def test_unreachable_broker_is_one_error_line_exit_2(tmp_path: Path) -> None:
    """Nothing listens at the bootstrap address: one `error:` line naming it, exit code 2,
    no traceback and no client log noise."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = with_overrides(Settings(), counters={"a": 0}, bootstrap_servers=f"127.0.0.1:{port}",
                       noise_key_file=str(write_key(tmp_path / "noise.key", TEST_SECRET)),
                       state_dir=str(tmp_path / "state"))
    res = _worker_start_error(s, tmp_path)
    assert res.returncode == 2, res.stderr
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"127.0.0.1:{port}" in lines[0] and "Traceback" not in res.stderr


@pytest.mark.kafka
def test_partition_count_mismatch_is_one_error_line_exit_2(
        live_factory: Callable[..., Live], tmp_path: Path) -> None:
    """The timeline topic exists with 3 partitions, the configuration says 2: one `error:`
    line naming the topic and both counts, exit code 2, no traceback. Control: with
    `partitions = 3` (and a fresh state changelog) the same check passes."""
    from processor.stream.worker.app import ensure_topics

    live = live_factory({"a": 0}, name="mismatch")
    timeline = f"{live.topics.timeline}-p3"
    kafka_io.create_topics(live.conf, [timeline], 3)
    s = with_overrides(live.settings, topics=replace(live.topics, timeline=timeline))
    res = _worker_start_error(s, tmp_path)
    assert res.returncode == 2, res.stderr
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert timeline in lines[0] and "3 partitions" in lines[0] and "says 2" in lines[0]
    assert "Traceback" not in res.stderr
    assert ensure_topics(with_overrides(s, partitions=3, app_id=f"{s.app_id}-p3")) == 1


def test_broker_security_settings_reach_both_clients(tmp_path: Path) -> None:
    """SASL_SSL settings become librdkafka properties (replay, demo, tests) and Faust
    credentials (the worker); the password is in neither repr. Control: PLAINTEXT settings
    produce no credentials and no security properties beyond the protocol."""
    import ssl

    import faust

    from processor.stream.model.config import SecuritySettings
    from processor.stream.worker.transport import broker_urls, faust_credentials

    base = with_overrides(Settings(), counters={"a": 0},
                          bootstrap_servers="k1.example:9093,k2.example:9093")
    sec = SecuritySettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                           sasl_username="svc", sasl_password="s3cret-pw")
    s = with_overrides(base, security=sec)
    conf = kafka_io.base_config(s)
    client = kafka_io.client_id(s)
    assert conf == {"bootstrap.servers": "k1.example:9093,k2.example:9093",
                    "client.id": client,
                    "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "svc", "sasl.password": "s3cret-pw"}
    assert client == f"dpc-{s.app_id}-{socket.gethostname()}-{os.getpid()}"
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.username == "svc" and creds.password == "s3cret-pw"
    assert str(creds.mechanism.value) == "SCRAM-SHA-512"
    assert isinstance(creds.ssl_context, ssl.SSLContext)
    assert "s3cret-pw" not in repr(creds) and "s3cret-pw" not in repr(s)
    assert broker_urls(s) == ["kafka://k1.example:9093", "kafka://k2.example:9093"]
    # Control: plaintext.
    assert faust_credentials(base) is None
    assert kafka_io.base_config(base) == {"bootstrap.servers": "k1.example:9093,k2.example:9093",
                                          "client.id": client,
                                          "security.protocol": "plaintext"}
