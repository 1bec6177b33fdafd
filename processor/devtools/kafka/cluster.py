"""`LocalKafka`: one or more nodes started, stopped, killed, restarted and attached to;
readiness by metadata requests; the client files a secured start writes."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from processor.devtools.kafka.fetch import default_libs_dir, fetch, is_fetched
from processor.devtools.kafka.node import Node
from processor.devtools.kafka.tls import (
    BROKER_USER,
    LISTENERS,
    SCRAM_MECHANISM,
    SECURITY_MODES,
    TlsFiles,
    librdkafka_security,
    make_tls_files,
)
from processor.devtools.kafka.tools import (
    DIR_PREFIX,
    LOG4J_FILE,
    BrokerStartError,
    LocalKafkaError,
    die_with_parent,
    free_port,
    new_cluster_id,
    port_accepts,
    require_tool,
    sweep_stale_dirs,
    tail,
)

#: Characters allowed in SCRAM user names and passwords given to the storage tool.
_SCRAM_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _admin(bootstrap: str, security: Mapping[str, str] | None = None) -> Any:
    # Imported here so that `fetch` needs nothing beyond the standard library.
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {
            **(security or {}),
            "bootstrap.servers": bootstrap,
            # librdkafka logs every refused connection at error level; the caller reports
            # what matters, so keep its own logging off.
            "log_level": 0,
            "socket.connection.setup.timeout.ms": 2000,
            "reconnect.backoff.max.ms": 500,
        }
    )


def broker_ids(bootstrap: str, timeout: float,
               security: Mapping[str, str] | None = None) -> set[int]:
    """The ids of the live brokers that ``bootstrap`` reports in one metadata request
    (``security``: librdkafka security properties for a secured listener).

    Raises confluent_kafka.KafkaException when no answer comes within ``timeout`` seconds.
    """
    metadata = _admin(bootstrap, security).list_topics(timeout=timeout)
    return {int(b) for b in metadata.brokers}


def wait_for_metadata(bootstrap: str, timeout: float = 60.0, min_brokers: int = 1) -> set[int]:
    """Wait until ``bootstrap`` answers a metadata request listing >= ``min_brokers`` brokers.

    For a cluster that is not ours (KAFKA_BOOTSTRAP_SERVERS). Returns the broker ids, or
    raises BrokerStartError after ``timeout`` seconds with the last error seen.
    """
    deadline = time.monotonic() + timeout
    last_error = "no answer"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerStartError(
                f"Kafka at {bootstrap} did not answer in {timeout:.0f}s: {last_error}")
        try:
            ids = broker_ids(bootstrap, timeout=min(5.0, max(0.5, remaining)))
        except Exception as exc:  # KafkaException; any failure just means "not yet"
            last_error = str(exc)
            continue
        if len(ids) >= min_brokers:
            return ids
        last_error = f"only {len(ids)} of {min_brokers} brokers"


class LocalKafka:
    """A real Apache Kafka cluster of ``nodes`` combined broker+controller nodes on loopback.

    Use as a context manager (or call ``start()`` / ``stop()``)::

        with LocalKafka() as kafka:                 # one node
            produce_to(kafka.bootstrap_servers)
        with LocalKafka(nodes=3) as cluster:        # replication factor 3, min ISR 2
            cluster.kill_node(0); ...; cluster.restart_node(0)

    Ports are chosen automatically unless ``ports`` (broker ports, one per node) is given.
    ``num_partitions`` is the default partition count of auto-created topics. Each JVM gets
    ``heap`` (``-Xmx``); ``jvm_opts`` and ``extra_config`` (server.properties entries,
    applied last) tune it further. With ``die_with_parent`` (the default, Linux only) the
    JVMs are killed if this Python process dies without calling ``stop()``; the command line
    turns it off so its nodes outlive it.

    ``security`` secures the client listener (one of SECURITY_MODES): ``"sasl_ssl"``
    (SCRAM-SHA-512 over TLS; ``scram_users`` name -> password are created when the storage
    is formatted, default one user ``client`` with a random password) or ``"mtls"``
    (TLS with ``ssl.client.auth=required``). A fresh test CA and certificates are made
    under the node directory (``tls``); brokers talk to each other on the same secured
    listener, and only the KRaft controller listener stays plaintext on loopback.
    ``client_security()`` / ``client_config()`` say how a client connects.
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        ports: Sequence[int] | None = None,
        num_partitions: int = 1,
        heap: str = "512m",
        jvm_opts: Sequence[str] = (),
        extra_config: Mapping[str, str] | None = None,
        libs_dir: Path | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 20.0,
        fetch_if_missing: bool = True,
        die_with_parent: bool = True,
        keep_dir: bool = False,
        security: str = "plaintext",
        scram_users: Mapping[str, str] | None = None,
    ) -> None:
        if security not in SECURITY_MODES:
            raise ValueError(f"security must be one of {SECURITY_MODES}, got {security!r}")
        users = dict(scram_users) if scram_users else {"client": secrets.token_hex(12)}
        for text in (*users, *users.values()):
            # The storage tool's --add-scram syntax has no quoting for , ] or =.
            if not text or not set(text) <= _SCRAM_CHARS:
                raise ValueError("SCRAM user names and passwords: letters, digits, . _ -")
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if ports is not None and len(ports) != nodes:
            raise ValueError(f"{len(ports)} ports given for {nodes} nodes")
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self.nodes = nodes
        self.num_partitions = num_partitions
        self.heap = heap
        self.jvm_opts = list(jvm_opts)
        self.extra_config = dict(extra_config or {})
        self.libs_dir = libs_dir
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.fetch_if_missing = fetch_if_missing
        self.die_with_parent = die_with_parent
        self.keep_dir = keep_dir
        self.security = security
        self.scram_users = users
        self._broker_password = secrets.token_hex(16)
        self._tls: TlsFiles | None = None
        self._fixed_ports = list(ports) if ports is not None else None
        self._nodes: list[Node] = []
        self._base_dir: Path | None = None
        self.cluster_id: str | None = None

    # -- public properties

    @property
    def replication_factor(self) -> int:
        """Default replication factor of new and internal topics: min(nodes, 3)."""
        return min(self.nodes, 3)

    @property
    def min_insync_replicas(self) -> int:
        """min.insync.replicas: 2 with three or more nodes (survives one loss), else 1."""
        return 2 if self.replication_factor >= 3 else 1

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every node, comma separated, for any Kafka client."""
        if not self._nodes:
            raise LocalKafkaError("LocalKafka is not started")
        return ",".join(n.bootstrap for n in self._nodes)

    @property
    def base_dir(self) -> Path | None:
        """The temporary directory holding every node's config, data and logs (None if stopped)."""
        return self._base_dir

    @property
    def tls(self) -> TlsFiles | None:
        """The test CA and certificates of a secured cluster (None for plaintext or stopped)."""
        return self._tls

    def client_security(self, user: str | None = None) -> dict[str, str]:
        """How a client reaches the client listener, as the processor's ``[security]``
        fields (security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile, sasl_mechanism,
        sasl_username, sasl_password); ``user`` is a SCRAM user (default the first).
        Plaintext: ``{"security_protocol": "PLAINTEXT"}``."""
        if self.security == "plaintext":
            return {"security_protocol": "PLAINTEXT"}
        tls = self._tls
        if tls is None:
            raise LocalKafkaError("LocalKafka is not started")
        if self.security == "mtls":
            return {"security_protocol": "SSL", "ssl_cafile": str(tls.ca_cert),
                    "ssl_certfile": str(tls.client_cert), "ssl_keyfile": str(tls.client_key)}
        name = user if user is not None else next(iter(self.scram_users))
        password = (self._broker_password if name == BROKER_USER
                    else self.scram_users[name])
        return {"security_protocol": "SASL_SSL", "ssl_cafile": str(tls.ca_cert),
                "sasl_mechanism": SCRAM_MECHANISM, "sasl_username": name,
                "sasl_password": password}

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """librdkafka configuration (bootstrap servers and security) for ``user``."""
        return {"bootstrap.servers": self.bootstrap_servers,
                **librdkafka_security(self.client_security(user))}

    def node_bootstrap(self, i: int) -> str:
        """``host:port`` of node ``i`` alone (0-based)."""
        return self._node(i).bootstrap

    def node_id(self, i: int) -> int:
        """Kafka's node.id (= broker id) of node ``i``; node i has id i + 1."""
        return self._node(i).node_id

    def index_of(self, node_id: int) -> int:
        """The 0-based index of the node whose Kafka node.id is ``node_id``."""
        for n in self._nodes:
            if n.node_id == node_id:
                return n.index
        raise KeyError(node_id)

    def is_alive(self, i: int) -> bool:
        """Whether node ``i``'s process is running."""
        return self._node(i).alive()

    # -- lifecycle

    def start(self) -> Self:
        """Fetch the jars if needed, format and start every node, wait until all answer.

        Raises ToolMissingError (no java / mvn), FetchError, or BrokerStartError (with the tail
        of the failing node's log). On failure nothing is left running.
        """
        if self._nodes:
            raise LocalKafkaError("LocalKafka is already started")
        java = require_tool("java")
        libs = self.libs_dir or default_libs_dir()
        if not is_fetched(libs):
            if not self.fetch_if_missing:
                raise BrokerStartError(
                    f"no Kafka jars in {libs}: run `python deploy/kafka.py fetch`")
            libs = fetch(libs)
        # A port picked as free can be taken by someone else before the JVM binds it; when
        # the ports were ours to choose, try once more with new ones.
        attempts = 1 if self._fixed_ports is not None else 2
        for attempt in range(attempts):
            try:
                self._start_once(java, libs)
                return self
            except BrokerStartError as exc:
                self._teardown()
                if attempt + 1 >= attempts or "Address already in use" not in str(exc):
                    raise
            except BaseException:
                self._teardown()  # e.g. Ctrl-C during startup: leave nothing running
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``stop_timeout``) and delete the dir."""
        self._teardown()

    def kill_node(self, i: int) -> None:
        """Crash node ``i``: SIGKILL, no clean shutdown, data dir kept for a restart."""
        node = self._node(i)
        node.send(signal.SIGKILL)
        node.wait_exit(self.stop_timeout)

    def restart_node(self, i: int, timeout: float | None = None) -> None:
        """Start node ``i`` again on its old ports and data, and wait until it is back.

        "Back" means the node answers a metadata request that lists itself as a broker.
        """
        node = self._node(i)
        if node.alive():
            raise LocalKafkaError(f"node {i} is still running")
        java = require_tool("java")
        libs = self.libs_dir or default_libs_dir()
        self._launch(java, libs, node)
        deadline = time.monotonic() + (timeout or self.start_timeout)
        self._wait_node(node, {node.node_id}, deadline)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- detached use by the command line

    def state(self) -> dict[str, Any]:
        """What `stop` and `status` need to find the nodes again (written by `start`)."""
        return {
            "cluster_id": self.cluster_id,
            "base_dir": str(self._base_dir),
            "bootstrap_servers": self.bootstrap_servers,
            "nodes": [
                {
                    "index": n.index,
                    "node_id": n.node_id,
                    "port": n.port,
                    "controller_port": n.controller_port,
                    "directory": str(n.directory),
                    "pid": n.current_pid(),
                }
                for n in self._nodes
            ],
        }

    @classmethod
    def attach(cls, state: Mapping[str, Any], stop_timeout: float = 20.0) -> LocalKafka:
        """A handle on nodes started by another process (from ``state()``), to stop them."""
        nodes = state["nodes"]
        kafka = cls(len(nodes), stop_timeout=stop_timeout, die_with_parent=False)
        kafka.cluster_id = state.get("cluster_id")
        kafka._base_dir = Path(state["base_dir"])
        kafka._nodes = [
            Node(
                index=int(n["index"]),
                node_id=int(n["node_id"]),
                port=int(n["port"]),
                controller_port=int(n["controller_port"]),
                directory=Path(n["directory"]),
                pid=int(n["pid"]) if n.get("pid") is not None else None,
            )
            for n in nodes
        ]
        return kafka

    # -- internals

    def _node(self, i: int) -> Node:
        if not self._nodes:
            raise LocalKafkaError("LocalKafka is not started")
        if not 0 <= i < len(self._nodes):
            raise IndexError(f"node index {i} out of range 0..{len(self._nodes) - 1}")
        return self._nodes[i]

    def _start_once(self, java: str, libs: Path) -> None:
        sweep_stale_dirs()
        # The owner's pid in the name lets a later sweep tell abandoned dirs from live ones.
        base = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        self._base_dir = base
        self.cluster_id = new_cluster_id()
        ports = self._fixed_ports or [free_port() for _ in range(self.nodes)]
        self._nodes = [
            Node(
                index=i,
                node_id=i + 1,
                port=ports[i],
                controller_port=free_port(),
                directory=base / f"node-{i}",
            )
            for i in range(self.nodes)
        ]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes)
        if self.security != "plaintext":
            self._tls = make_tls_files(base / "tls", name=f"local-kafka-{base.name}")
        for node in self._nodes:
            node.logs_dir.mkdir(parents=True)
            node.config_file.write_text(self._properties(node, voters), encoding="utf-8")
        self._format_all(java, libs)
        if self.die_with_parent:
            atexit.register(self._teardown)
        for node in self._nodes:
            self._launch(java, libs, node)
        deadline = time.monotonic() + self.start_timeout
        everyone = {n.node_id for n in self._nodes}
        for node in self._nodes:
            self._wait_node(node, everyone, deadline)

    def _properties(self, node: Node, voters: str) -> str:
        rf = self.replication_factor
        min_isr = self.min_insync_replicas
        listener = LISTENERS[self.security]
        props: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": (
                f"{listener}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": f"{listener}://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
            "log.dirs": str(node.directory / "data"),
            "num.partitions": str(self.num_partitions),
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "default.replication.factor": str(rf),
            "min.insync.replicas": str(min_isr),
            "offsets.topic.replication.factor": str(rf),
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(min_isr),
            # Fewer internal partitions: the first consumer group / transaction starts faster.
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.num.partitions": "10",
            # Tests start groups all the time; do not wait 3 s for more members to join.
            "group.initial.rebalance.delay.ms": "0",
            "unclean.leader.election.enable": "false",
            # A small machine (2 cores) runs up to three of these next to the tests.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            # Notice a killed node within a few seconds (defaults: 2 s / 9 s).
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "6000",
        }
        props.update(self._security_properties())
        props.update(self.extra_config)
        header = f"# Written by processor.devtools.kafka for node {node.index}.\n"
        return header + "".join(f"{k}={v}\n" for k, v in props.items())

    def _security_properties(self) -> dict[str, str]:
        """server.properties entries of a secured client listener (none for plaintext)."""
        tls = self._tls
        if self.security == "plaintext" or tls is None:
            return {}
        props = {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls.keystore),
            "ssl.keystore.password": tls.store_password,
            "ssl.key.password": tls.store_password,
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(tls.truststore),
            "ssl.truststore.password": tls.store_password,
        }
        if self.security == "mtls":
            props["ssl.client.auth"] = "required"
            return props
        jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{BROKER_USER}" password="{self._broker_password}";')
        props.update({
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
        })
        return props

    def _scram_args(self) -> list[str]:
        """The storage tool's --add-scram arguments: the broker's user and the clients'."""
        if self.security != "sasl_ssl":
            return []
        users = {BROKER_USER: self._broker_password, **self.scram_users}
        args: list[str] = []
        for name, password in users.items():
            args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        return args

    def _probe_security(self) -> dict[str, str]:
        """librdkafka security of the readiness probe (as the broker's own SCRAM user)."""
        if self.security == "plaintext":
            return {}
        return librdkafka_security(self.client_security(BROKER_USER))

    def _java_cmd(self, java: str, libs: Path, logs_dir: Path, heap: str) -> list[str]:
        return [
            java,
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",  # one GC thread: cheapest on a 2-core machine
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration={LOG4J_FILE.as_uri()}",
            f"-Dkafka.logs.dir={logs_dir}",
            *self.jvm_opts,
            "-cp",
            str(libs / "*"),
        ]

    def _format_all(self, java: str, libs: Path) -> None:
        # The nodes' storage is formatted in parallel: each format is a short JVM run.
        assert self.cluster_id is not None
        running: list[tuple[Node, subprocess.Popen[bytes], Path]] = []
        for node in self._nodes:
            out = node.logs_dir / "format.log"
            cmd = [
                *self._java_cmd(java, libs, node.logs_dir, "256m"),
                # A run of a few seconds: the C1 compiler alone starts faster.
                "-XX:TieredStopAtLevel=1",
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self.cluster_id,
                "--config",
                str(node.config_file),
                "--ignore-formatted",
                *self._scram_args(),
            ]
            with out.open("wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            running.append((node, proc, out))
        failures = []
        for node, proc, out in running:
            try:
                rc = proc.wait(timeout=self.start_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            if rc != 0:
                failures.append(f"node {node.index}: StorageTool format exited {rc}\n{tail(out)}")
        if failures:
            raise BrokerStartError("formatting KRaft storage failed:\n" + "\n".join(failures))

    def _launch(self, java: str, libs: Path, node: Node) -> None:
        cmd = [*self._java_cmd(java, libs, node.logs_dir, self.heap), "kafka.Kafka"]
        cmd.append(str(node.config_file))
        if self.die_with_parent:
            # The kernel kills the JVM when this process goes, even on SIGKILL of pytest.
            cmd = die_with_parent(cmd, "KILL")
        with (node.logs_dir / "stdout.log").open("ab") as out:
            node.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Detached nodes get their own session so Ctrl-C in the shell spares them.
                start_new_session=not self.die_with_parent,
            )
        node.pid = node.process.pid

    def _wait_node(self, node: Node, expected: set[int], deadline: float) -> None:
        """Wait until ``node`` answers metadata listing every id in ``expected``."""
        last = "no answer yet"
        while True:
            if not node.alive():
                raise BrokerStartError(
                    f"Kafka node {node.index} exited during startup ({last}).\n{node.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"Kafka node {node.index} did not answer in time ({last}).\n{node.log_tail()}"
                )
            if port_accepts("127.0.0.1", node.port):
                try:
                    ids = broker_ids(node.bootstrap, timeout=min(3.0, max(0.5, remaining)),
                                     security=self._probe_security())
                except Exception as exc:  # not ready yet: KafkaException
                    last = str(exc)
                else:
                    if expected <= ids:
                        return
                    last = f"brokers {sorted(ids)} of {sorted(expected)} registered"
                    # The metadata call returned at once; pace the next one.
                    self._pause(node, 0.2)
            else:
                # Not listening yet: wait on the process itself, so an exit is seen at once.
                self._pause(node, 0.2)

    @staticmethod
    def _pause(node: Node, seconds: float) -> None:
        if node.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=seconds)
        else:
            time.sleep(seconds)

    def _teardown(self) -> None:
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.send(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for node in nodes:
            if not node.wait_exit(deadline - time.monotonic()):
                node.send(signal.SIGKILL)
                node.wait_exit(5.0)
        with contextlib.suppress(Exception):
            atexit.unregister(self._teardown)
        base, self._base_dir = self._base_dir, None
        self._tls = None
        if base is not None and not self.keep_dir:
            shutil.rmtree(base, ignore_errors=True)


def client_files(state_file: Path) -> tuple[Path, Path]:
    """Where ``start --security`` writes how a client connects, next to ``state_file``:
    (librdkafka properties, the processor's TOML settings)."""
    stem = state_file.with_suffix("").name
    return (state_file.with_name(f"{stem}-client.properties"),
            state_file.with_name(f"{stem}-client.toml"))


def remove_client_files(state_file: Path) -> None:
    """Delete what ``write_client_files`` wrote next to ``state_file``, if anything."""
    for path in client_files(state_file):
        path.unlink(missing_ok=True)


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)  # a new file, so the mode below is its mode
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def write_client_files(kafka: LocalKafka, state_file: Path) -> tuple[Path, Path]:
    """Write how a client reaches ``kafka``'s client listener (``client_files``), mode
    0600 (the SCRAM password is in them; the CA and the client certificate and key they
    name live in the broker's directory):

    - ``*-client.properties``: librdkafka keys, bootstrap.servers included (confluent-kafka,
      ``kcat -F``, any librdkafka client);
    - ``*-client.toml``: ``bootstrap_servers`` and the ``[security]`` table of the
      processor's configuration, to merge into a config file (docs in deploy/README.md).
    """
    props_path, toml_path = client_files(state_file)
    head = (f"Written by `python deploy/kafka.py start --security {kafka.security}` for the "
            f"local broker at {kafka.bootstrap_servers}; `stop` deletes it.")
    props = "".join(f"{k}={v}\n" for k, v in kafka.client_config().items())
    _write_private(props_path, f"# {head}\n{props}")
    # JSON strings of printable text are valid TOML basic strings.
    fields = "".join(f"{k} = {json.dumps(v)}\n" for k, v in kafka.client_security().items())
    _write_private(toml_path, f"# {head}\n# Merge into a processor configuration: replace "
                   "its bootstrap_servers and its [security] table.\n"
                   f"bootstrap_servers = {json.dumps(kafka.bootstrap_servers)}\n"
                   f"[security]\n{fields}")
    return props_path, toml_path


def read_client_properties(path: Path) -> dict[str, str]:
    """A properties file as ``write_client_files`` writes it: key=value lines, # comments."""
    conf: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            conf[key.strip()] = value.strip()
    return conf
