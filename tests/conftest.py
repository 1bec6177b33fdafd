"""Shared test fixtures: a real Kafka broker for the tests marked ``kafka``, and topic helpers.

Where the broker comes from (fixture ``kafka_bootstrap``, once per test session):

1. ``KAFKA_BOOTSTRAP_SERVERS`` if set: an existing cluster, used as is (never stopped);
2. else a testcontainers Kafka, if a Docker engine answers a quick ping (about a second at
   most; set ``KAFKA_TEST_DOCKER=0`` to skip the probe);
3. else ``LocalKafka`` (``processor.devtools.kafka``): the real Apache Kafka jars from
   Maven Central, one combined broker+controller node on 127.0.0.1.

If Java or Maven is missing for (3), the fixture fails with a clear message when ``CI`` is
set (a CI run must never pass by skipping its broker tests) and skips with the reason
otherwise. ``kafka_cluster`` is a three-node LocalKafka (replication factor 3, min ISR 2),
started on demand once per test module, for failure tests that kill nodes.

Helpers (plain functions, also available as fixtures of the same name):
``unique_topic(prefix)`` gives a topic name no other test uses; ``create_topics(bootstrap,
names, partitions)`` creates topics and waits until every partition has a leader.

``deployment_factory(counters, **kw)`` builds an isolated deployment of the processor on
the session broker (``processor.devtools.deployment.isolated_deployment``: unique app id
and topics, key, state dir and config under the test's ``tmp_path``, a worker not yet
started) and closes every deployment it made (workers stopped) when the test ends.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from processor.devtools.kafka.cluster import LocalKafka, wait_for_metadata
from processor.devtools.kafka.fetch import is_fetched
from processor.devtools.kafka.tools import BrokerStartError, ToolMissingError, require_tool

if TYPE_CHECKING:
    from processor.devtools.deployment import Deployment

ROOT = Path(__file__).resolve().parents[1]

# Files the tests write are private to their owner (umask 077), as `keygen` makes a noise
# key: a key file open to other users is refused (processor/keyfile.py), and the many key
# files tests write with write_text would otherwise be 0644. The tests of that refusal
# set the modes they check explicitly.
os.umask(0o077)

# KAFKA_BOOTSTRAP_SERVERS is read once and moved out of the environment: every child
# process a test starts (a worker, a CLI) would read it as a settings override and connect
# to the shared broker instead of the one its test configured (an unreachable address, a
# secured listener). The test processes pytest-xdist spawns inherit the moved value.
_SHARED_BOOTSTRAP_ENV = "PYTEST_KAFKA_BOOTSTRAP"
_shared = os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", "").strip()
if _shared:
    os.environ[_SHARED_BOOTSTRAP_ENV] = _shared


def in_ci() -> bool:
    """Whether this run is CI (``CI`` set to a true value), where nothing may be skipped."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def unique_topic(prefix: str) -> str:
    """A topic name that starts with ``prefix`` and that no other test (or run) uses."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", prefix) or "t"
    return f"{clean}-{uuid.uuid4().hex[:12]}"


def create_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 1,
    replication_factor: int | None = None,
    timeout: float = 60.0,
    config: dict[str, str] | None = None,
) -> None:
    """Create ``names`` with ``partitions`` partitions each and wait until they are usable.

    ``replication_factor`` None means the broker's default. Returns once a metadata request
    shows every partition of every topic with a leader, so producers and consumers started
    right after do not race the controller. Raises on any creation error (including
    "already exists": tests must use fresh names from ``unique_topic``).
    """
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [
        NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor if replication_factor is not None else -1,
            config=dict(config or {}),
        )
        for name in names
    ]
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + timeout
    # A cluster whose node just restarted can drop the request with the connection
    # (librdkafka destroys the broker handle): asked again, a topic the lost request did
    # create answers "already exists", which is then no error.
    retriable = {KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}
    pending, retried = list(new), False
    while pending:
        futures = admin.create_topics(pending, operation_timeout=timeout,
                                      request_timeout=timeout)
        again = []
        for spec in pending:
            try:
                futures[spec.topic].result(timeout=timeout)
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if retried and code == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                if code not in retriable or time.monotonic() > deadline:
                    raise
                again.append(spec)
        pending, retried = again, retried or bool(again)
    missing: list[str] = list(names)
    while missing:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"topics without leaders after {timeout:.0f}s: {missing}")
        topics = admin.list_topics(timeout=min(5.0, remaining)).topics
        missing = [
            name
            for name in names
            if name not in topics
            or topics[name].error is not None
            or len(topics[name].partitions) != partitions
            or any(p.leader < 0 for p in topics[name].partitions.values())
        ]


@pytest.fixture(name="unique_topic")
def _unique_topic_fixture() -> Callable[[str], str]:
    """``unique_topic`` as a fixture, so tests need no import from conftest."""
    return unique_topic


@pytest.fixture(name="create_topics")
def _create_topics_fixture() -> Callable[..., None]:
    """``create_topics`` as a fixture, so tests need no import from conftest."""
    return create_topics


def docker_answers(timeout: float = 1.0) -> bool:
    """Whether a Docker engine answers a ping within ``timeout`` seconds (False on any doubt).

    With no DOCKER_HOST and no /var/run/docker.sock this returns at once.
    """
    if os.environ.get("KAFKA_TEST_DOCKER", "").strip() == "0":
        return False
    host = os.environ.get("DOCKER_HOST", "").strip()
    if not host or host.startswith("unix://"):
        sock_path = host.removeprefix("unix://") or "/var/run/docker.sock"
        if not os.path.exists(sock_path):
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(sock_path)
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                reply = sock.recv(512)
        except OSError:
            return False
        status_line = reply.split(b"\r\n", 1)[0]
        return status_line.startswith(b"HTTP/1.") and b" 200 " in status_line + b" "
    try:
        # By name at run time: `deploy/docker/` (the container files) would otherwise shadow
        # the docker package for a type checker given deploy/kafka.py on its command line.
        docker = importlib.import_module("docker")
        client = docker.DockerClient(base_url=host, timeout=max(1, round(timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _missing_broker(reason: str) -> NoReturn:
    # In CI a missing broker is a failure; on a laptop without Java it is a skip.
    if in_ci():
        pytest.fail(f"no Kafka broker for the tests marked `kafka`: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


def _start_local(nodes: int) -> LocalKafka:
    # Generous: CI shares 2 cores with the JVMs; a healthy start takes 5-20 s.
    kafka = LocalKafka(nodes, start_timeout=180.0)
    try:
        kafka.start()
    except ToolMissingError as exc:
        _missing_broker(f"{exc} (or set KAFKA_BOOTSTRAP_SERVERS to an existing cluster)")
    return kafka


@pytest.fixture(scope="session")
def local_kafka_available() -> None:
    """For tests that start their own ``LocalKafka`` nodes: Java (and jars or Maven) present.

    Fails (CI) or skips (elsewhere) unless Java is on PATH and the jars are fetched or
    Maven can fetch them.
    """
    try:
        require_tool("java")
        if not is_fetched():
            require_tool("mvn")
    except ToolMissingError as exc:
        _missing_broker(str(exc))


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker, shared by the whole test session."""
    env = os.environ.get(_SHARED_BOOTSTRAP_ENV, "").strip()
    if env:
        try:
            wait_for_metadata(env, timeout=30.0)
        except BrokerStartError as exc:
            pytest.fail(f"KAFKA_BOOTSTRAP_SERVERS={env} does not answer: {exc}", pytrace=False)
        yield env
        return
    if docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        container = KafkaContainer().with_kraft()
        container.start()
        try:
            yield str(container.get_bootstrap_server())
        finally:
            container.stop()
        return
    kafka = _start_local(1)
    try:
        yield str(kafka.bootstrap_servers)
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[LocalKafka]:
    """A three-node LocalKafka (replication factor 3, min.insync.replicas 2) for this module.

    Always local, even with KAFKA_BOOTSTRAP_SERVERS set, because tests kill and restart its
    nodes (``kill_node(i)``, ``restart_node(i)``).
    """
    cluster = _start_local(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def deployment_factory(
    kafka_bootstrap: str, tmp_path: Path
) -> Iterator[Callable[..., Deployment]]:
    """``factory(counters, **kw)`` -> an isolated Deployment on the session broker.

    ``kw`` goes to ``isolated_deployment`` (``name``, ``secret``, any setting); the files
    go under ``tmp_path`` (kept for a look after a failure). Every worker of every
    deployment made is stopped at teardown.
    """
    # Imported here: the deployment helper pulls in the Kafka clients, which tests
    # without a broker need not load.
    from processor.devtools.deployment import isolated_deployment

    made: list[Deployment] = []

    def factory(counters: dict[str, int], **kw: Any) -> Deployment:
        deployment = isolated_deployment(kafka_bootstrap, counters, parent=tmp_path, **kw)
        made.append(deployment)
        return deployment

    yield factory
    for deployment in made:
        deployment.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a broker fixture as ``kafka``, so ``-m "not kafka"`` works."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if {"kafka_bootstrap", "kafka_cluster", "local_kafka_available"} & set(fixtures):
            item.add_marker(pytest.mark.kafka)
