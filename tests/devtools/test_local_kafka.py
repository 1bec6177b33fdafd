"""The local Apache Kafka broker really works (processor.devtools.kafka, its command
line deploy/kafka.py, and the conftest fixtures).

Broker tests (marked ``kafka``): 1,000 keyed messages through a 3-partition topic come back
complete and in order per partition; a three-node cluster loses a partition leader to
SIGKILL mid-stream and, with acks=all and min.insync.replicas=2, loses no message; the
command line starts, reports and stops a broker. No test here is statistical: every check
is exact, so the false-alarm rate is 0 on a correct broker.

The rest needs no broker: missing ``java`` / ``mvn`` gives exit code 3 and a clear
message, and a cached download is reused without running Maven.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from processor.devtools.kafka import cli as lk_cli
from processor.devtools.kafka import cluster as lk_cluster
from processor.devtools.kafka import fetch as lk_fetch
from processor.devtools.kafka import node as lk_node
from processor.devtools.kafka import tls as lk_tls
from processor.devtools.kafka import tools as lk_tools
from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.kafka.tools import BrokerStartError, LocalKafkaError
from tests.conftest import ROOT, docker_answers
from tests.devtools.procs import exec_done, running

#: The command line as deploy/setup.sh and the docs run it (the thin wrapper script).
KAFKA_SCRIPT = ROOT / "deploy" / "kafka.py"

Delivered = dict[str, tuple[int, int]]  # value -> (partition, offset), from delivery reports
Consumed = dict[str, tuple[int, int]]  # value -> (partition, offset), as read back


def _messages(start: int, count: int, keys: int = 37) -> list[tuple[str, str]]:
    """``count`` (key, value) pairs; value "k<key>:<n>" numbers the messages of each key."""
    return [(f"k{n % keys}", f"k{n % keys}:{n}") for n in range(start, start + count)]


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            # Retries after a leader change must not write a message twice.
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
        }
    )


def _consumer(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
        }
    )
    consumer.subscribe([topic])
    return consumer


def _where(msg: Message) -> tuple[int, int]:
    """(partition, offset) of a produced or consumed message."""
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None
    return partition, offset


def _produce(
    producer: Producer, topic: str, messages: Iterable[tuple[str, str]], delivered: Delivered
) -> list[str]:
    """Produce and flush; fill ``delivered`` from the reports; return the delivery errors."""
    errors: list[str] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        value = msg.value()
        assert isinstance(value, bytes)
        if err is not None:
            errors.append(f"{value.decode()}: {err}")
        else:
            delivered[value.decode()] = _where(msg)

    for key, value in messages:
        producer.produce(topic, key=key.encode(), value=value.encode(), on_delivery=report)
        producer.poll(0)
    left = producer.flush(120.0)
    assert left == 0, f"{left} messages still queued after 120 s"
    return errors


def _consume(
    consumer: Consumer, consumed: Consumed, order: dict[int, list[str]], want: int, timeout: float
) -> None:
    """Read until ``consumed`` holds ``want`` distinct values or ``timeout`` seconds pass.

    A value read again at the same (partition, offset) is a harmless re-read (e.g. after a
    rebalance); the same value at a different offset is a duplicate in the log and fails.
    """
    deadline = time.monotonic() + timeout
    while len(consumed) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            assert err.code() == KafkaError._PARTITION_EOF or err.retriable(), str(err)
            continue
        raw = msg.value()
        assert isinstance(raw, bytes)
        value, where = raw.decode(), _where(msg)
        if value in consumed:
            assert consumed[value] == where, f"{value} is in the log twice: {consumed[value]}"
            continue
        consumed[value] = where
        order[where[0]].append(value)


def _check_order(delivered: Delivered, order: dict[int, list[str]]) -> None:
    """Each partition was read in offset order, and each key's messages in production order."""
    for partition, values in order.items():
        offsets = [delivered[v][1] for v in values]
        assert offsets == sorted(offsets), f"partition {partition} read out of offset order"
    per_key: dict[str, list[int]] = defaultdict(list)
    key_partition: dict[str, set[int]] = defaultdict(set)
    for values in order.values():
        for value in values:
            key, n = value.split(":")
            per_key[key].append(int(n))
            key_partition[key].add(delivered[value][0])
    for key, numbers in per_key.items():
        assert numbers == sorted(numbers), f"key {key} read out of production order"
        assert len(key_partition[key]) == 1, f"key {key} spread over {key_partition[key]}"


@pytest.mark.kafka
def test_keyed_messages_round_trip_in_order_per_partition(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    create_topics: Callable[..., None],
) -> None:
    """1,000 keyed messages into 3 partitions all come back, each partition in order."""
    topic = unique_topic("broker-roundtrip")
    create_topics(kafka_bootstrap, [topic], partitions=3)
    messages = _messages(0, 1000)
    delivered: Delivered = {}
    errors = _produce(_producer(kafka_bootstrap), topic, messages, delivered)
    assert errors == []
    assert len(delivered) == 1000
    assert {p for p, _ in delivered.values()} == {0, 1, 2}, "keys did not spread over 3 partitions"

    consumer = _consumer(kafka_bootstrap, topic)
    consumed: Consumed = {}
    order: dict[int, list[str]] = defaultdict(list)
    try:
        _consume(consumer, consumed, order, want=1000, timeout=60.0)
    finally:
        consumer.close()
    assert consumed == delivered  # every message, at the offset its delivery report gave
    for partition, values in order.items():
        # Exactly the partition's log, read front to back with no gap.
        assert [delivered[v][1] for v in values] == list(range(len(values))), partition
    _check_order(delivered, order)


@pytest.mark.kafka
def test_three_node_cluster_loses_a_leader_and_no_message(
    kafka_cluster: LocalKafka,
    unique_topic: Callable[[str], str],
    create_topics: Callable[..., None],
) -> None:
    """Kill partition 0's leader (SIGKILL) mid-stream: with acks=all nothing is lost.

    The cluster has replication factor 3 and min.insync.replicas 2, so every acknowledged
    write is on at least two nodes and one loss leaves enough in-sync replicas to go on.
    The killed node then restarts and catches up: every partition is back to 3 in-sync
    replicas.
    """
    bootstrap = kafka_cluster.bootstrap_servers
    assert kafka_cluster.replication_factor == 3
    assert kafka_cluster.min_insync_replicas == 2
    topic = unique_topic("broker-failover")
    create_topics(bootstrap, [topic], partitions=3, replication_factor=3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # A new client may first ask a node whose metadata does not list the topic's partitions
    # yet (an empty partition map): wait until one answer shows all three with leaders.
    deadline = time.monotonic() + 30.0
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        if len(meta.partitions) == 3 and all(p.leader >= 0 for p in meta.partitions.values()):
            break
        assert time.monotonic() < deadline, "topic metadata incomplete after 30 s"
        time.sleep(0.1)  # polling interval of a deadline loop
    assert all(len(p.replicas) == 3 for p in meta.partitions.values())
    victim = kafka_cluster.index_of(meta.partitions[0].leader)

    producer = _producer(bootstrap)
    consumer = _consumer(bootstrap, topic)
    delivered: Delivered = {}
    consumed: Consumed = {}
    order: dict[int, list[str]] = defaultdict(list)
    try:
        assert _produce(producer, topic, _messages(0, 500), delivered) == []
        _consume(consumer, consumed, order, want=500, timeout=60.0)
        assert len(consumed) == 500

        kafka_cluster.kill_node(victim)
        assert not kafka_cluster.is_alive(victim)
        # Keep producing and consuming in small steps while the cluster elects new leaders.
        for start in range(500, 1000, 100):
            assert _produce(producer, topic, _messages(start, 100), delivered) == []
            _consume(consumer, consumed, order, want=len(consumed) + 1, timeout=5.0)
        _consume(consumer, consumed, order, want=1000, timeout=90.0)
    finally:
        consumer.close()
    assert len(delivered) == 1000
    assert consumed == delivered, f"lost: {sorted(set(delivered) - set(consumed))[:10]}"
    _check_order(delivered, order)
    deadline = time.monotonic() + 30.0
    while 0 not in (after := admin.list_topics(topic, timeout=10).topics[topic]).partitions:
        assert time.monotonic() < deadline, "topic metadata incomplete after 30 s"
        time.sleep(0.1)  # polling interval of a deadline loop
    assert after.partitions[0].leader != kafka_cluster.node_id(victim)

    kafka_cluster.restart_node(victim)
    deadline = time.monotonic() + 90.0
    while True:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        if len(parts) == 3 and all(len(p.isrs) == 3 for p in parts):
            break
        assert time.monotonic() < deadline, "restarted node did not rejoin every ISR in 90 s"
        time.sleep(0.5)  # polling metadata: the ISR has no change notification for clients


@pytest.mark.kafka
@pytest.mark.usefixtures("local_kafka_available")
def test_failed_start_names_the_cause_and_leaves_nothing_behind() -> None:
    """A node that cannot bind its port: BrokerStartError quoting the log's cause, nothing left.

    The port is given explicitly, so LocalKafka must not retry on other ports.
    """
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        kafka = LocalKafka(1, ports=[port], start_timeout=120.0)
        with pytest.raises(BrokerStartError) as info:
            kafka.start()
    message = str(info.value)
    assert "exited during startup" in message
    assert f"127.0.0.1:{port}: Address already in use" in message  # from server.log
    found = re.search(r"(/\S*/local-kafka-[^/\s]+)/node-0/logs/server.log", message)
    assert found is not None, message
    assert not Path(found.group(1)).exists()  # temp dir removed
    assert kafka.base_dir is None
    with pytest.raises(LocalKafkaError):
        _ = kafka.bootstrap_servers  # no half-started handle


@pytest.mark.kafka
@pytest.mark.usefixtures("local_kafka_available")
def test_command_line_start_status_stop(tmp_path: Path) -> None:
    """`start` leaves a broker that `status` sees; `stop` ends it and deletes its data."""
    state = tmp_path / "state.json"
    base = [sys.executable, str(KAFKA_SCRIPT)]
    started = subprocess.run(
        [*base, "start", "--state-file", str(state)], capture_output=True, text=True, timeout=180
    )
    try:
        assert started.returncode == 0, started.stderr
        info = json.loads(state.read_text())
        bootstrap = started.stdout.strip()
        assert bootstrap == info["bootstrap_servers"]
        # stderr's line is whole without stdout (the demo shows stderr, reads stdout).
        assert "Kafka is up in " in started.stderr and f" at {bootstrap}\n" in started.stderr
        assert lk_cluster.broker_ids(bootstrap, timeout=10.0) == {1}
        status = subprocess.run(
            [*base, "status", "--state-file", str(state)], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout
        # A second start asking for the running broker's ports (or none) uses it: exit 0,
        # its address on stdout, the broker and its data untouched (the demo's broker is
        # the README's). Asking for other ports: exit 1, saying how to use the running one.
        port = bootstrap.rsplit(":", 1)[1]
        for ports in ([], ["--ports", port]):
            again = subprocess.run([*base, "start", "--state-file", str(state), *ports],
                                   capture_output=True, text=True, timeout=60)
            assert (again.returncode, again.stdout.strip()) == (0, bootstrap), again.stderr
            assert f"already running at {bootstrap} " in again.stderr
        other = subprocess.run([*base, "start", "--state-file", str(state), "--ports",
                                str(int(port) + 1)], capture_output=True, text=True, timeout=60)
        assert other.returncode == 1 and other.stdout == ""
        assert f"export KAFKA_BOOTSTRAP_SERVERS={bootstrap}" in other.stderr
        assert lk_cluster.broker_ids(bootstrap, timeout=10.0) == {1}
        assert json.loads(state.read_text()) == info
    finally:
        stopped = subprocess.run(
            [*base, "stop", "--state-file", str(state)], capture_output=True, text=True
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists()
    assert not Path(info["base_dir"]).exists()
    pid = info["nodes"][0]["pid"]
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"kafka.Kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    after = subprocess.run(
        [*base, "status", "--state-file", str(state)], capture_output=True, text=True
    )
    assert after.returncode == 1


@pytest.mark.kafka
@pytest.mark.usefixtures("local_kafka_available")
def test_a_start_whose_output_is_closed_leaves_a_broker_stop_finds(tmp_path: Path) -> None:
    """`start 2>&1 | head -1`: the reader goes after the first line, so every later print
    fails; the broker started meanwhile is still recorded, and `stop` ends it. (Before,
    the state was written after the prints: such a start left a broker no command knew.)"""
    state = tmp_path / "state.json"
    base = [sys.executable, str(KAFKA_SCRIPT)]
    start = subprocess.Popen([*base, "start", "--state-file", str(state)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert start.stdout is not None
    first = start.stdout.readline()
    start.stdout.close()  # as `head -1` does after its line
    start.wait(timeout=180)
    assert first.startswith(b"starting 1 Kafka node(s)")
    try:
        info = json.loads(state.read_text())
        assert lk_cluster.broker_ids(info["bootstrap_servers"], timeout=10.0) == {1}
    finally:
        stopped = subprocess.run([*base, "stop", "--state-file", str(state)],
                                 capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    pid = info["nodes"][0]["pid"]
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"kafka.Kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


@pytest.mark.kafka
@pytest.mark.usefixtures("local_kafka_available")
def test_command_line_secured_start_writes_client_settings(tmp_path: Path) -> None:
    """`start --security sasl_ssl` prints the bootstrap servers and the path of the client
    properties; both client files are mode 0600 and hold the SCRAM password that the
    output never shows. The properties produce and consume a record; the TOML, merged
    into a processor configuration, gives the same client settings (Settings ->
    kafka_io.base_config), and `python -m processor replay` on it gets past the brokers'
    login to the missing topics. `status` answers over the secured listener; `stop`
    removes the broker, its directory and the client files. Control: the same
    configuration with a wrong password is refused."""
    from processor.keyfile import write_key
    from processor.stream.kafka import kafka_io
    from processor.stream.model.config import load_settings

    state = tmp_path / "state.json"
    base = [sys.executable, str(KAFKA_SCRIPT)]
    started = subprocess.run([*base, "start", "--security", "sasl_ssl", "--heap", "256m",
                              "--state-file", str(state)],
                             capture_output=True, text=True, timeout=180)
    props_file, toml_file = lk_cluster.client_files(state)
    try:
        assert started.returncode == 0, started.stderr
        info = json.loads(state.read_text())
        bootstrap, line = started.stdout.strip().splitlines()
        assert bootstrap == info["bootstrap_servers"] and info["security"] == "sasl_ssl"
        assert line == f"client properties: {props_file}"
        for path in (props_file, toml_file):
            assert path.stat().st_mode & 0o777 == 0o600, path
        conf = lk_cluster.read_client_properties(props_file)
        password = conf["sasl.password"]
        assert password and password not in started.stdout + started.stderr
        assert conf["bootstrap.servers"] == bootstrap
        assert conf["security.protocol"] == "sasl_ssl"

        topic = f"secured-cli-{uuid.uuid4().hex[:8]}"
        kafka_io.create_topics(conf, [topic], 1)
        kafka_io.produce_all(conf, topic, [(None, b"over sasl_ssl")])
        assert [r.value for r in kafka_io.read_topic(conf, topic)[0]] == [b"over sasl_ssl"]

        key = write_key(tmp_path / "noise.key")
        config = tmp_path / "worker.toml"

        def write_config(text: str) -> None:
            config.write_text(f"noise_key_file = {json.dumps(str(key))}\n{text}"
                              "[counters]\na = 0\n")

        write_config(toml_file.read_text())
        settings = load_settings(str(config), {})
        # The client properties plus the process's own client id (kafka_io.client_id).
        assert kafka_io.base_config(settings) == {
            **conf, "client.id": kafka_io.client_id(settings)}
        replay = [sys.executable, "-m", "processor", "replay", "--config", str(config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPC_")}
        res = subprocess.run(replay, capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=env)
        assert res.returncode == 2 and "no topic" in res.stderr, res.stderr

        status = subprocess.run([*base, "status", "--state-file", str(state)],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout

        # Control: one wrong setting, and the brokers refuse.
        write_config(toml_file.read_text().replace(password, "not-the-password"))
        res = subprocess.run(replay, capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=env)
        assert res.returncode == 2 and "SASL authentication failed" in res.stderr, res.stderr
        assert password not in res.stderr
    finally:
        stopped = subprocess.run([*base, "stop", "--state-file", str(state)],
                                 capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists() and not props_file.exists() and not toml_file.exists()
    assert not Path(info["base_dir"]).exists()
    assert not running(info["nodes"][0]["pid"])


# ----------------------------------------------------------------------------- no broker


def test_the_order_and_loss_checks_reject_wrong_reads() -> None:
    """Control for the broker tests: the same checks fail on a lost, swapped or doubled read."""
    delivered: Delivered = {"k0:0": (0, 0), "k0:2": (0, 1), "k1:1": (1, 0)}
    good = {0: ["k0:0", "k0:2"], 1: ["k1:1"]}
    _check_order(delivered, good)  # the correct read passes
    with pytest.raises(AssertionError, match="out of offset order"):
        _check_order(delivered, {0: ["k0:2", "k0:0"], 1: ["k1:1"]})
    spread = {**delivered, "k0:3": (1, 1)}  # one key in two partitions
    with pytest.raises(AssertionError, match="spread over"):
        _check_order(spread, {0: ["k0:0", "k0:2"], 1: ["k1:1", "k0:3"]})

    class FakeMessage:
        """Just enough of confluent_kafka.Message for _consume."""

        def __init__(self, value: str, partition: int, offset: int) -> None:
            self._v, self._p, self._o = value.encode(), partition, offset

        def error(self) -> None:
            return None

        def value(self) -> bytes:
            return self._v

        def partition(self) -> int:
            return self._p

        def offset(self) -> int:
            return self._o

    class FakeConsumer:
        """Replays a fixed list of messages, then returns None."""

        def __init__(self, messages: list[FakeMessage]) -> None:
            self._messages = messages

        def poll(self, timeout: float) -> FakeMessage | None:
            return self._messages.pop(0) if self._messages else None

    consumed: Consumed = {}
    order: dict[int, list[str]] = defaultdict(list)
    reread = [FakeMessage("k0:0", 0, 0), FakeMessage("k0:0", 0, 0), FakeMessage("k0:2", 0, 1)]
    _consume(FakeConsumer(reread), consumed, order, want=2, timeout=5.0)  # type: ignore[arg-type]
    assert consumed == {"k0:0": (0, 0), "k0:2": (0, 1)}  # a re-read is not a new message
    assert consumed != delivered  # and a lost message ("k1:1") shows as a difference
    doubled = [FakeMessage("k0:0", 0, 0), FakeMessage("k0:0", 0, 5)]
    with pytest.raises(AssertionError, match="in the log twice"):
        _consume(FakeConsumer(doubled), {}, defaultdict(list), want=3, timeout=1.0)  # type: ignore[arg-type]


def _env_without_tools(tmp_path: Path) -> dict[str, str]:
    """The environment with a PATH on which neither java nor mvn can be found."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return {**os.environ, "PATH": str(empty)}


def test_missing_java_or_maven_exits_3_with_a_clear_message(tmp_path: Path) -> None:
    """Without java, `start` exits 3 naming java; without mvn, `fetch` exits 3 naming mvn."""
    env = _env_without_tools(tmp_path)
    base = [sys.executable, str(KAFKA_SCRIPT)]
    start = subprocess.run(
        [*base, "start", "--state-file", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert start.returncode == lk_cli.EXIT_MISSING_TOOL == 3
    assert "`java` was not found on PATH" in start.stderr
    fetch = subprocess.run(
        [*base, "fetch", "--libs-dir", str(tmp_path / "libs")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert fetch.returncode == 3
    assert "`mvn` was not found on PATH" in fetch.stderr
    assert not (tmp_path / "libs").exists()


def test_command_line_runs_on_a_bare_interpreter(tmp_path: Path) -> None:
    """deploy/setup.sh fetches before the project is installed: the wrapper must run on the
    base interpreter in isolated mode (no venv, no site-packages, no PYTHONPATH)."""
    base = getattr(sys, "_base_executable", sys.executable)
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-3.9.2.jar").write_bytes(b"")
    (libs / ".fetched").write_text(lk_fetch.pom_fingerprint() + "\n")
    run = subprocess.run(
        [base, "-I", str(KAFKA_SCRIPT), "fetch", "--libs-dir", str(libs)],
        capture_output=True,
        text=True,
        env=_env_without_tools(tmp_path),
    )
    assert run.returncode == 0, run.stderr
    assert "already in" in run.stderr  # the cached jars, found without Maven


def test_cached_download_is_reused_and_a_stale_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache stamped with this pom.xml's hash is used without Maven; any other stamp is not.

    With no mvn on PATH, reusing the cache succeeds and refetching raises ToolMissingError,
    so the outcome shows whether Maven would have run.
    """
    monkeypatch.setenv("PATH", _env_without_tools(tmp_path)["PATH"])
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-3.9.2.jar").write_bytes(b"")
    (libs / ".fetched").write_text(lk_fetch.pom_fingerprint() + "\n")
    assert lk_fetch.is_fetched(libs)
    assert lk_fetch.fetch(libs) == libs.resolve()

    (libs / ".fetched").write_text("0" * 64 + "\n")  # made from another pom.xml
    assert not lk_fetch.is_fetched(libs)
    with pytest.raises(lk_tools.ToolMissingError):
        lk_fetch.fetch(libs)


def test_cluster_ids_are_valid_kraft_uuids() -> None:
    """Cluster ids are 22 URL-safe base64 characters (16 bytes), never starting with '-'."""
    import base64

    ids = {lk_tools.new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_replication_settings_follow_the_node_count() -> None:
    """One node: RF 1, min ISR 1. Three nodes: RF 3, min ISR 2 (survives one loss)."""
    one, three = LocalKafka(1), LocalKafka(3)
    assert (one.replication_factor, one.min_insync_replicas) == (1, 1)
    assert (three.replication_factor, three.min_insync_replicas) == (3, 2)
    with pytest.raises(LocalKafkaError):
        _ = one.bootstrap_servers  # not started


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", True),
        (b"HTTP/1.1 500 Err\r\n\r\n", False),
    ],
)
def test_docker_probe_believes_only_a_200_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reply: bytes, expected: bool
) -> None:
    """The fixture's Docker probe: a 200 answer to /_ping is an engine, anything else is not.

    Uses a fake engine on a Unix socket; a missing socket is "no engine" without waiting.
    """
    path = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.delenv("KAFKA_TEST_DOCKER", raising=False)
    assert docker_answers() is False  # no socket file yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(512)
                conn.sendall(reply)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            assert docker_answers(timeout=5.0) is expected
        finally:
            thread.join(timeout=10)
    monkeypatch.setenv("KAFKA_TEST_DOCKER", "0")
    assert docker_answers() is False  # the probe can be switched off


def test_sweep_deletes_only_dirs_whose_owner_and_nodes_are_gone(tmp_path: Path) -> None:
    """Abandoned node dirs go; a live owner's dir and a dir a live process uses stay."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    assert dead and not Path(f"/proc/{dead}").exists()
    abandoned = tmp_path / f"local-kafka-{dead}-aaaa"
    live_owner = tmp_path / f"local-kafka-{os.getpid()}-bbbb"
    detached = tmp_path / f"local-kafka-{dead}-cccc"  # its owner exited, its node did not
    for path in (abandoned, live_owner, detached):
        (path / "node-0").mkdir(parents=True)
    node = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", str(detached / "server.properties")],
        stdin=subprocess.PIPE,
    )
    # Until the child has exec'd, /proc shows the parent's command line: wait for its own.
    deadline = time.monotonic() + 30
    cmdline = Path(f"/proc/{node.pid}/cmdline")
    while str(detached).encode() not in cmdline.read_bytes():
        assert time.monotonic() < deadline, "the stand-in node process did not start"
        time.sleep(0.01)  # polling interval of a deadline loop
    try:
        assert lk_tools.sweep_stale_dirs(tmp_path) == [abandoned]
    finally:
        assert node.stdin is not None
        node.stdin.close()
        node.wait(timeout=30)
    assert not abandoned.exists() and live_owner.exists() and detached.exists()
    assert lk_tools.sweep_stale_dirs(tmp_path) == [detached]  # once its process is gone


def test_secured_modes_write_the_listener_the_ssl_stores_and_the_scram_users(
    tmp_path: Path, local_kafka_available: None
) -> None:
    """No broker started: the properties and format arguments of each security mode.

    sasl_ssl: one SASL_SSL listener (also inter-broker), SCRAM-SHA-512 with the broker's
    own user in the JAAS line and every user created at format time; mtls: an SSL listener
    with ssl.client.auth=required; both with the PKCS12 stores made for them, and the
    stores really hold what they should (the keystore opens with the password and its
    certificate names 127.0.0.1; the truststore is readable by keytool and lists the CA).
    Controls: plaintext writes none of it, and unquotable SCRAM names are refused."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import pkcs12

    tls = lk_tls.make_tls_files(tmp_path / "tls")
    node = lk_node.Node(0, 1, 9092, 9093, tmp_path / "node")
    voters = "1@127.0.0.1:9093"
    sasl = LocalKafka(security="sasl_ssl", scram_users={"dpc": "pw-1"})
    sasl._tls = tls
    props = dict(line.split("=", 1) for line in sasl._properties(node, voters).splitlines()
                 if line and not line.startswith("#"))
    assert props["listeners"].startswith("SASL_SSL://127.0.0.1:9092,")
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["ssl.keystore.type"] == "PKCS12" and props["ssl.keystore.location"] == str(
        tls.keystore)
    assert f'username="{lk_tls.BROKER_USER}"' in props[
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    scram = sasl._scram_args()
    assert scram.count("--add-scram") == 2 and "SCRAM-SHA-512=[name=dpc,password=pw-1]" in scram
    assert sasl.client_security()["sasl_username"] == "dpc"

    mtls = LocalKafka(security="mtls")
    mtls._tls = tls
    props = dict(line.split("=", 1) for line in mtls._properties(node, voters).splitlines()
                 if line and not line.startswith("#"))
    assert props["ssl.client.auth"] == "required" and props["listeners"].startswith("SSL://")
    assert mtls._scram_args() == [] and "sasl.enabled.mechanisms" not in props
    assert lk_tls.librdkafka_security(mtls.client_security()) == {
        "security.protocol": "ssl", "ssl.ca.location": str(tls.ca_cert),
        "ssl.certificate.location": str(tls.client_cert),
        "ssl.key.location": str(tls.client_key)}

    key, cert, _chain = pkcs12.load_key_and_certificates(tls.keystore.read_bytes(),
                                                         tls.store_password.encode())
    assert key is not None and cert is not None
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    listing = subprocess.run(["keytool", "-list", "-keystore", str(tls.truststore),
                              "-storepass", tls.store_password], capture_output=True, text=True)
    assert listing.returncode == 0 and "trustedCertEntry" in listing.stdout
    assert (tls.client_key.stat().st_mode & 0o777) == 0o600

    plain = LocalKafka()
    text = plain._properties(node, voters)
    assert "ssl." not in text and "sasl." not in text and plain._scram_args() == []
    with pytest.raises(ValueError):
        LocalKafka(security="sasl_ssl", scram_users={"a,b": "x"})
    with pytest.raises(ValueError):
        LocalKafka(security="kerberos")


def _orphan_survives(wrap: bool) -> bool:
    """Start a parent that starts `sleep 60` (wrapped by die_with_parent or not), wait until
    the child runs `sleep`, SIGKILL the parent, and say whether the sleep is still running
    5 s later."""
    script = ("import subprocess, sys\n"
              "from processor.devtools.kafka.tools import die_with_parent\n"
              "cmd = ['sleep', '60']\n"
              f"cmd = die_with_parent(cmd, 'TERM') if {wrap} else cmd\n"
              "p = subprocess.Popen(cmd, start_new_session=True)\n"
              "print(p.pid, flush=True)\n"
              "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while not exec_done(child, "sleep"):
            assert time.monotonic() < deadline, "the child never ran sleep"
            time.sleep(0.01)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not running(child):
                return False
            time.sleep(0.05)
        return True
    finally:
        parent.kill()
        parent.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(shutil.which("setpriv") is None or not sys.platform.startswith("linux"),
                    reason="needs util-linux setpriv on Linux")
def test_die_with_parent_child_goes_when_its_parent_is_killed() -> None:
    """What the demo's live view and the local broker rely on; control: the same child
    without the wrapper outlives its killed parent."""
    assert not _orphan_survives(True)
    assert _orphan_survives(False)
