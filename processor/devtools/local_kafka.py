"""A real Apache Kafka broker on loopback, without Docker: fetch, start, stop, status.

Development tooling (the demo, the tests and the benchmarks start their brokers with
``LocalKafka``); nothing in the processor's runtime path imports it. The command line is
``python deploy/kafka.py ...`` (a thin wrapper kept where the scripts and docs expect it)
or, equivalently, ``python -m processor.devtools.local_kafka ...``::

    python deploy/kafka.py fetch           # download the broker jars once (Maven Central)
    python deploy/kafka.py start           # one combined broker+controller node
    python deploy/kafka.py start-cluster   # three nodes, replication factor 3, min ISR 2
    python deploy/kafka.py start --security sasl_ssl   # or mtls: a secured client listener
    python deploy/kafka.py status
    python deploy/kafka.py stop

How it works: ``mvn dependency:copy-dependencies`` on ``deploy/kafka/pom.xml`` copies
``org.apache.kafka:kafka_2.13`` and its runtime dependencies into a cache directory (default
``deploy/.cache/kafka-libs``), which becomes the classpath. Each node gets a properties file
in a fresh temporary directory, its KRaft storage is formatted with
``kafka.tools.StorageTool format``, and ``kafka.Kafka`` runs as one combined
broker+controller process on 127.0.0.1. A node counts as up only when it answers a metadata
request (confluent_kafka AdminClient) that lists every broker of the cluster. Stopping sends
SIGTERM, then SIGKILL after a timeout, and removes the temporary directory.

``LocalKafka(security="sasl_ssl" | "mtls")`` secures the client listener for the tests of
the secured path: a fresh test CA and certificates (``make_tls_files``: PEM for clients,
PKCS12 stores for the broker), SCRAM-SHA-512 users created at format time
(``--add-scram``) or ``ssl.client.auth=required``; ``client_security()`` says how to connect.
The command line's ``start --security MODE`` writes that next to its state file
(``write_client_files``): a librdkafka properties file and the processor's
``bootstrap_servers`` + ``[security]`` as TOML, both mode 0600; ``stop`` removes them.

Only the Python standard library is needed to fetch (``deploy/setup.sh`` may run it with a
bare interpreter); confluent_kafka is imported when a node's readiness is checked. The
pom.xml, the broker's log4j settings and the jar cache live in the checkout's ``deploy/``
directory, so this module works from a source checkout (or an editable install) only.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

#: The checkout's deploy/ directory: pom.xml, log4j settings, the jar cache.
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
POM_FILE = DEPLOY_DIR / "kafka" / "pom.xml"
LOG4J_FILE = DEPLOY_DIR / "kafka" / "log4j.properties"
DEFAULT_LIBS_DIR = DEPLOY_DIR / ".cache" / "kafka-libs"
DEFAULT_STATE_FILE = DEPLOY_DIR / ".cache" / "run" / "local-kafka.json"

# Environment overrides (documented in deploy/README.md).
LIBS_DIR_ENV = "LOCAL_KAFKA_LIBS"
MAVEN_ARGS_ENV = "LOCAL_KAFKA_MAVEN_ARGS"

# Exit codes of the command line.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_MISSING_TOOL = 3

_STAMP_NAME = ".fetched"
_DIR_PREFIX = "local-kafka-"
#: Characters allowed in SCRAM user names and passwords given to the storage tool.
_SCRAM_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_KAFKA_JAR_PREFIX = "kafka_2.13-"
_INSTALL_HINTS = {
    "java": "install a Java 17 runtime, e.g. `apt-get install openjdk-17-jre-headless`",
    "mvn": "install Apache Maven, e.g. `apt-get install maven`",
}


def die_with_parent(cmd: list[str], signal_name: str) -> list[str]:
    """`cmd` run so that the kernel sends it `signal_name` when the process that started
    it goes, even on SIGKILL (util-linux setpriv --pdeathsig; Linux). Elsewhere, or
    without setpriv, `cmd` unchanged."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return cmd
    return [setpriv, "--pdeathsig", signal_name, *cmd]


class LocalKafkaError(RuntimeError):
    """Base class of every error this module raises on purpose."""


class ToolMissingError(LocalKafkaError):
    """``java`` or ``mvn`` is not on PATH, so the local broker cannot be fetched or run."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        hint = _INSTALL_HINTS.get(tool, "install it")
        super().__init__(f"`{tool}` was not found on PATH: {hint}")


class FetchError(LocalKafkaError):
    """Maven could not download the broker jars; the message ends with Maven's output."""


class StartError(LocalKafkaError):
    """A node did not come up in time or exited; the message ends with the tail of its log."""


# ----------------------------------------------------------------------------- tools


def require_tool(name: str) -> str:
    """Return the full path of the executable ``name``, or raise ToolMissingError."""
    path = shutil.which(name)
    if path is None:
        raise ToolMissingError(name)
    return path


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ("" when it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            # Reading the last 64 KiB is plenty for 40 log lines and bounded for huge logs.
            fh.seek(max(0, size - 65536))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def error_lines(path: Path, limit: int = 10) -> str:
    """The last ``limit`` ERROR / FATAL entries of a broker log, with their exception lines.

    An entry is the log line plus the exception messages under it (the lines of its stack
    trace that are not ``at ...`` frames, e.g. "...: Address already in use", "Caused by:
    ..."). Each line is cut to 500 characters.
    """
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4 * 1024 * 1024))  # bounded read of a big log
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    entries: list[list[str]] = []
    inside = False
    for line in data.splitlines():
        if line.startswith("["):
            inside = " ERROR " in line or " FATAL " in line
            if inside:
                entries.append([line[:500]])
        elif inside and line.strip() and not line.lstrip().startswith(("at ", "...")):
            entries[-1].append("    " + line.strip()[:500])
    return "\n".join("\n".join(entry) for entry in entries[-limit:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to (host, port) is accepted within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes in URL-safe base64 without padding.

    This is the text form of Kafka's ``Uuid``; like ``Uuid.randomUuid`` it never starts
    with "-" (such ids are awkward on command lines).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def sweep_stale_dirs(tmp: Path | None = None) -> list[Path]:
    """Delete node directories left behind by owners that died without ``stop()``.

    A directory ``local-kafka-<pid>-*`` is stale when process <pid> is gone and no running
    process mentions the directory on its command line (a detached node started by the
    command line outlives its owner, so that check keeps it). Returns what was deleted.
    """
    root = tmp or Path(tempfile.gettempdir())
    candidates = []
    for path in root.glob(f"{_DIR_PREFIX}*-*"):
        owner = path.name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if path.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            candidates.append(path)
    if not candidates:
        return []
    in_use = b"\0".join(_cmdlines())
    stale = [p for p in candidates if str(p).encode() not in in_use]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _cmdlines() -> list[bytes]:
    # Every readable /proc/<pid>/cmdline; processes that vanish meanwhile are skipped.
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                found.append((proc / "cmdline").read_bytes())
    return found


# ----------------------------------------------------------------------------- fetch


def default_libs_dir() -> Path:
    """The jar cache: $LOCAL_KAFKA_LIBS if set, else deploy/.cache/kafka-libs."""
    env = os.environ.get(LIBS_DIR_ENV)
    return Path(env).expanduser().resolve() if env else DEFAULT_LIBS_DIR


def _pom_fingerprint() -> str:
    # The cache is valid for exactly one pom.xml: a version bump refetches.
    return hashlib.sha256(POM_FILE.read_bytes()).hexdigest()


def is_fetched(libs_dir: Path | None = None) -> bool:
    """Whether ``libs_dir`` holds a complete download made from the current pom.xml."""
    libs = libs_dir or default_libs_dir()
    stamp = libs / _STAMP_NAME
    try:
        recorded = stamp.read_text(encoding="ascii").strip()
    except OSError:
        return False
    has_kafka = any(p.name.startswith(_KAFKA_JAR_PREFIX) for p in libs.glob("*.jar"))
    return has_kafka and recorded == _pom_fingerprint()


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    # Several engineers (or pytest and a demo) may fetch at once; one downloads, the rest wait.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def fetch(
    libs_dir: Path | None = None,
    maven_args: Sequence[str] = (),
    *,
    force: bool = False,
    log: IO[str] | None = None,
) -> Path:
    """Download the broker jars into ``libs_dir`` (once) and return that directory.

    A complete cached download (stamped with the pom.xml's hash) is reused without running
    Maven. Otherwise Maven copies the jars into a sibling temporary directory, which then
    replaces ``libs_dir`` in one rename, so a failed or concurrent fetch never leaves a half
    filled cache. ``maven_args`` (and $LOCAL_KAFKA_MAVEN_ARGS) are passed to mvn, e.g.
    ``-Dmaven.repo.local=/tmp/m2``. Raises ToolMissingError or FetchError.
    """
    libs = (libs_dir or default_libs_dir()).resolve()
    if not force and is_fetched(libs):
        return libs
    mvn = require_tool("mvn")
    require_tool("java")  # Maven itself runs on Java; say so clearly rather than via mvn.
    extra = [*shlex.split(os.environ.get(MAVEN_ARGS_ENV, "")), *maven_args]
    with _exclusive_lock(libs.parent / f"{libs.name}.lock"):
        if not force and is_fetched(libs):
            return libs  # another process fetched it while we waited for the lock
        part = Path(tempfile.mkdtemp(prefix=f"{libs.name}.part-", dir=libs.parent))
        try:
            mvn_log = part / "maven.log"
            cmd = [
                mvn,
                "-B",
                "-q",
                "-f",
                str(POM_FILE),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={part}",
                "-DincludeScope=runtime",
                *extra,
            ]
            if log is not None:
                print(f"fetching Kafka jars with: {shlex.join(cmd)}", file=log, flush=True)
            with mvn_log.open("wb") as out:
                rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=DEPLOY_DIR)
            if rc != 0:
                raise FetchError(f"mvn exited with {rc}:\n{tail(mvn_log)}")
            if not any(p.name.startswith(_KAFKA_JAR_PREFIX) for p in part.glob("*.jar")):
                raise FetchError(f"mvn succeeded but no {_KAFKA_JAR_PREFIX}*.jar was copied")
            mvn_log.unlink()
            (part / _STAMP_NAME).write_text(_pom_fingerprint() + "\n", encoding="ascii")
            old: Path | None = None
            if libs.exists():
                old = libs.with_name(f"{libs.name}.old-{os.getpid()}")
                libs.rename(old)
            part.rename(libs)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if part.exists():
                shutil.rmtree(part, ignore_errors=True)
    return libs


# ----------------------------------------------------------------------------- readiness


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
    raises StartError after ``timeout`` seconds with the last error seen.
    """
    deadline = time.monotonic() + timeout
    last_error = "no answer"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StartError(f"Kafka at {bootstrap} did not answer in {timeout:.0f}s: {last_error}")
        try:
            ids = broker_ids(bootstrap, timeout=min(5.0, max(0.5, remaining)))
        except Exception as exc:  # KafkaException; any failure just means "not yet"
            last_error = str(exc)
            continue
        if len(ids) >= min_brokers:
            return ids
        last_error = f"only {len(ids)} of {min_brokers} brokers"


# ----------------------------------------------------------------------------- TLS material

#: Security of the client listener: ``plaintext``; ``sasl_ssl`` (TLS, then SCRAM-SHA-512
#: with users created when the storage is formatted); ``mtls`` (TLS with
#: ``ssl.client.auth=required``: a client shows a certificate signed by the test CA).
SECURITY_MODES = ("plaintext", "sasl_ssl", "mtls")
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The user the broker itself logs in as on a SASL_SSL inter-broker listener.
BROKER_USER = "local-kafka-broker"
#: The client listener's name (and security protocol) per mode.
_LISTENERS = {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL", "mtls": "SSL"}
#: librdkafka property of each ``client_security`` field.
_LIBRDKAFKA_NAMES = {
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
}


def librdkafka_security(fields: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties of ``client_security`` fields (what the processor's
    kafka_io.security_config builds from the same fields; kept here so this module needs
    nothing of the processor)."""
    conf = {"security.protocol": fields.get("security_protocol", "PLAINTEXT").lower()}
    conf.update({_LIBRDKAFKA_NAMES[k]: v for k, v in fields.items()
                 if k in _LIBRDKAFKA_NAMES and v})
    return conf


@dataclass(frozen=True)
class TlsFiles:
    """A test CA and what it signed, in the formats each side reads.

    Clients (librdkafka, Python's ssl for aiokafka) read PEM: ``ca_cert``, and for mutual
    TLS ``client_cert`` / ``client_key`` (key unencrypted). The broker (Java) reads PKCS12:
    ``keystore`` (its key and chain, valid for 127.0.0.1 and localhost, usable as server
    and as client for inter-broker connections) and ``truststore`` (the CA), both under
    ``store_password``.
    """

    directory: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    keystore: Path
    truststore: Path
    store_password: str


def make_tls_files(directory: Path, *, name: str = "local-kafka",
                   hosts: Sequence[str] = ("127.0.0.1", "localhost"),
                   valid_days: int = 2) -> TlsFiles:
    """Make a fresh CA, a broker certificate for ``hosts`` and a client certificate under
    ``directory`` (created; private keys mode 0600).

    The keys and certificates come from the ``cryptography`` package; the PKCS12
    truststore from Java's ``keytool`` (a PKCS12 store holding only a trusted certificate
    needs a Java-specific attribute that only keytool writes). Another call gives another
    CA: a client that trusts it is refused by a broker whose certificate this one signed.
    """
    import ipaddress
    import secrets
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)  # tolerate small clock skew
    until = now + timedelta(days=valid_days)

    def subject(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
              signer: ec.EllipticCurvePrivateKey, *, ca: bool,
              usages: Sequence[x509.ObjectIdentifier] = (),
              sans: Sequence[x509.GeneralName] = ()) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject(cn)).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(until)
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)),
                                            critical=False)
        return builder.sign(signer, hashes.SHA256())

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = subject(f"{name} test CA")
    ca = issue(f"{name} test CA", ca_key, ca_name, ca_key, ca=True)
    broker_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    broker = issue(f"{name} broker", broker_key, ca_name, ca_key, ca=False, sans=sans,
                   usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = issue(f"{name} client", client_key, ca_name, ca_key, ca=False,
                   usages=(ExtendedKeyUsageOID.CLIENT_AUTH,))

    password = secrets.token_hex(16)
    files = TlsFiles(
        directory=directory,
        ca_cert=write(directory / "ca.pem", pem(ca)),
        client_cert=write(directory / "client.pem", pem(client)),
        client_key=write(directory / "client.key", client_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()), 0o600),
        keystore=write(directory / "broker.p12", pkcs12.serialize_key_and_certificates(
            b"broker", broker_key, broker, [ca],
            serialization.BestAvailableEncryption(password.encode())), 0o600),
        truststore=directory / "truststore.p12",
        store_password=password,
    )
    keytool = require_tool("keytool")
    files.truststore.unlink(missing_ok=True)  # keytool would add to an old store
    out = subprocess.run(
        [keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", str(files.ca_cert),
         "-keystore", str(files.truststore), "-storetype", "PKCS12",
         "-storepass", password],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise StartError(f"keytool could not write the truststore: {out.stdout}{out.stderr}")
    return files


# ----------------------------------------------------------------------------- processes


@dataclass
class _Node:
    """One combined broker+controller process and where it lives."""

    index: int
    node_id: int
    port: int
    controller_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # set when attached to a node started by another process

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def current_pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid
        return self.pid

    def alive(self) -> bool:
        """Whether the node's process is running (and, if attached, really is this node)."""
        if self.process is not None:
            return self.process.poll() is None
        if self.pid is None:
            return False
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        # Guards against a recycled pid: the process must run this node's config file.
        return b"kafka.Kafka" in cmdline and str(self.config_file).encode() in cmdline

    def send(self, sig: int) -> None:
        pid = self.current_pid()
        if pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to end; True when it has."""
        if self.process is not None:
            try:
                self.process.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.alive():
            # Not our child, so there is nothing to wait() on: poll /proc until it is gone.
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def log_tail(self, lines: int = 40) -> str:
        """What to show when the node failed: its ERROR/FATAL lines, then the last lines.

        The cause (e.g. "Address already in use") is usually logged long before the last
        lines, which are the shutdown that followed it.
        """
        parts = []
        server_log = self.logs_dir / "server.log"
        errors = error_lines(server_log)
        if errors:
            parts.append(f"--- {server_log} (ERROR / FATAL lines) ---\n{errors}")
        for name in ("server.log", "stdout.log"):
            text = tail(self.logs_dir / name, lines)
            if text:
                parts.append(f"--- {self.logs_dir / name} (last lines) ---\n{text}")
        return "\n".join(parts) or f"(no log in {self.logs_dir})"


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
        self._nodes: list[_Node] = []
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

    def log_file(self, i: int) -> Path:
        """Node ``i``'s broker log (server.log)."""
        return self._node(i).logs_dir / "server.log"

    # -- lifecycle

    def start(self) -> LocalKafka:
        """Fetch the jars if needed, format and start every node, wait until all answer.

        Raises ToolMissingError (no java / mvn), FetchError, or StartError (with the tail
        of the failing node's log). On failure nothing is left running.
        """
        if self._nodes:
            raise LocalKafkaError("LocalKafka is already started")
        java = require_tool("java")
        libs = self.libs_dir or default_libs_dir()
        if not is_fetched(libs):
            if not self.fetch_if_missing:
                raise StartError(f"no Kafka jars in {libs}: run `python deploy/kafka.py fetch`")
            libs = fetch(libs)
        # A port picked as free can be taken by someone else before the JVM binds it; when
        # the ports were ours to choose, try once more with new ones.
        attempts = 1 if self._fixed_ports is not None else 2
        for attempt in range(attempts):
            try:
                self._start_once(java, libs)
                return self
            except StartError as exc:
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

    def stop_node(self, i: int) -> None:
        """Shut node ``i`` down cleanly (SIGTERM, SIGKILL after ``stop_timeout``)."""
        node = self._node(i)
        node.send(signal.SIGTERM)
        if not node.wait_exit(self.stop_timeout):
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

    def __enter__(self) -> LocalKafka:
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
            _Node(
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

    def _node(self, i: int) -> _Node:
        if not self._nodes:
            raise LocalKafkaError("LocalKafka is not started")
        if not 0 <= i < len(self._nodes):
            raise IndexError(f"node index {i} out of range 0..{len(self._nodes) - 1}")
        return self._nodes[i]

    def _start_once(self, java: str, libs: Path) -> None:
        sweep_stale_dirs()
        # The owner's pid in the name lets a later sweep tell abandoned dirs from live ones.
        base = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-"))
        self._base_dir = base
        self.cluster_id = new_cluster_id()
        ports = self._fixed_ports or [free_port() for _ in range(self.nodes)]
        self._nodes = [
            _Node(
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

    def _properties(self, node: _Node, voters: str) -> str:
        rf = self.replication_factor
        min_isr = self.min_insync_replicas
        listener = _LISTENERS[self.security]
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
        header = f"# Written by processor.devtools.local_kafka for node {node.index}.\n"
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
        running: list[tuple[_Node, subprocess.Popen[bytes], Path]] = []
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
            raise StartError("formatting KRaft storage failed:\n" + "\n".join(failures))

    def _launch(self, java: str, libs: Path, node: _Node) -> None:
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

    def _wait_node(self, node: _Node, expected: set[int], deadline: float) -> None:
        """Wait until ``node`` answers metadata listing every id in ``expected``."""
        last = "no answer yet"
        while True:
            if not node.alive():
                raise StartError(
                    f"Kafka node {node.index} exited during startup ({last}).\n{node.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StartError(
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
    def _pause(node: _Node, seconds: float) -> None:
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


# ----------------------------------------------------------------------------- client files


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


# ----------------------------------------------------------------------------- command line


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data


def _cmd_fetch(args: argparse.Namespace, maven_args: list[str]) -> int:
    libs = Path(args.libs_dir).resolve() if args.libs_dir else None
    target = libs or default_libs_dir()
    if not args.force and is_fetched(target):
        print(f"Kafka jars already in {target} (cached; --force to fetch again)", file=sys.stderr)
        return EXIT_OK
    started = time.monotonic()
    path = fetch(libs, maven_args, force=args.force, log=sys.stderr)
    jars = len(list(path.glob("*.jar")))
    took = time.monotonic() - started
    print(f"fetched {jars} jars into {path} in {took:.1f}s", file=sys.stderr)
    return EXIT_OK


def _cmd_start(args: argparse.Namespace, nodes: int) -> int:
    state_file = Path(args.state_file)
    old = _read_state(state_file)
    if old is not None:
        attached = LocalKafka.attach(old)
        if any(attached.is_alive(i) for i in range(attached.nodes)):
            print(
                f"a local Kafka is already running ({old.get('bootstrap_servers')}); "
                "run `python deploy/kafka.py stop` first",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        attached.stop()  # leftovers of a crashed run: clean them up
        state_file.unlink(missing_ok=True)
    remove_client_files(state_file)
    ports = [int(p) for p in args.ports.split(",")] if args.ports else None
    kafka = LocalKafka(
        nodes,
        ports=ports,
        num_partitions=args.partitions,
        heap=args.heap,
        libs_dir=Path(args.libs_dir).resolve() if args.libs_dir else None,
        start_timeout=args.timeout,
        die_with_parent=args.foreground,
        security=args.security,
    )
    started = time.monotonic()
    print(f"starting {nodes} Kafka node(s) on 127.0.0.1 ...", file=sys.stderr)
    kafka.start()
    took = time.monotonic() - started
    written: tuple[Path, Path] | None = None
    if args.security != "plaintext":
        state_file.parent.mkdir(parents=True, exist_ok=True)
        written = write_client_files(kafka, state_file)
        print(f"client settings ({args.security}, mode 0600): {written[0]} (librdkafka) and "
              f"{written[1]} (the processor's bootstrap_servers and [security])",
              file=sys.stderr)
    print(f"Kafka is up in {took:.1f}s; bootstrap servers:", file=sys.stderr)
    print(kafka.bootstrap_servers, flush=True)
    if written is not None:
        print(f"client properties: {written[0]}", flush=True)
    if args.foreground:
        print("running in the foreground; Ctrl-C stops it", file=sys.stderr)
        # Block the signals and wait for one, instead of a KeyboardInterrupt mid-stop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            kafka.stop()
            remove_client_files(state_file)
        return EXIT_OK
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state = {**kafka.state(), "security": args.security}
    state_file.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    print(f"stop it with: python deploy/kafka.py stop   (state in {state_file})", file=sys.stderr)
    return EXIT_OK


def _cmd_stop(args: argparse.Namespace) -> int:
    state_file = Path(args.state_file)
    state = _read_state(state_file)
    if state is None:
        print("no local Kafka is recorded as running", file=sys.stderr)
        return EXIT_OK
    LocalKafka.attach(state, stop_timeout=args.timeout).stop()
    state_file.unlink(missing_ok=True)
    remove_client_files(state_file)
    print("stopped", file=sys.stderr)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    state = _read_state(Path(args.state_file))
    if state is None:
        print("not running")
        return EXIT_FAILURE
    kafka = LocalKafka.attach(state)
    security: dict[str, str] | None = None
    props_file = client_files(Path(args.state_file))[0]
    if state.get("security", "plaintext") != "plaintext" and props_file.is_file():
        security = {k: v for k, v in read_client_properties(props_file).items()
                    if k != "bootstrap.servers"}
    healthy = True
    expected = {int(n["node_id"]) for n in state["nodes"]}
    for i in range(kafka.nodes):
        alive = kafka.is_alive(i)
        answer = "-"
        if alive:
            try:
                ids = broker_ids(kafka.node_bootstrap(i), timeout=5.0, security=security)
                answer = f"sees brokers {sorted(ids)}"
                healthy = healthy and ids == expected
            except Exception as exc:
                answer = f"no metadata answer ({exc})"
                healthy = False
        else:
            healthy = False
        state_word = "running" if alive else "NOT running"
        print(f"node {i} (id {kafka.node_id(i)}) {kafka.node_bootstrap(i)}: {state_word}, {answer}")
    print(f"bootstrap servers: {state['bootstrap_servers']}")
    return EXIT_OK if healthy else EXIT_FAILURE


def build_parser() -> argparse.ArgumentParser:
    """The command line's argument parser."""
    parser = argparse.ArgumentParser(
        prog="python deploy/kafka.py",
        description="Fetch, start and stop a real Apache Kafka broker on 127.0.0.1 (no Docker).",
        epilog=(
            "Exit codes: 0 ok, 1 failure (or `status`: not running), 2 usage, "
            "3 java or mvn missing. Extra -D... arguments of `fetch` go to Maven."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download the broker jars from Maven Central (once)")
    p_fetch.add_argument("--force", action="store_true", help="fetch even if cached")
    for name, nodes, text in (
        ("start", 1, "start one combined broker+controller node in the background"),
        ("start-cluster", 3, "start three nodes (replication factor 3, min ISR 2)"),
    ):
        p = sub.add_parser(name, help=text)
        p.set_defaults(nodes=nodes)
        p.add_argument(
            "--ports", help="broker ports, comma separated, one per node (default: free)"
        )
        p.add_argument("--partitions", type=int, default=1, help="num.partitions (default 1)")
        p.add_argument("--heap", default="512m", help="JVM -Xmx per node (default 512m)")
        p.add_argument("--timeout", type=float, default=120.0, help="startup timeout, seconds")
        p.add_argument(
            "--foreground", action="store_true", help="stay in the foreground until Ctrl-C"
        )
        p.add_argument(
            "--security", choices=SECURITY_MODES, default="plaintext",
            help="secure the client listener: sasl_ssl (SCRAM-SHA-512 over TLS, user "
            "`client`, a random password) or mtls (TLS with client certificates); a fresh "
            "test CA; the client settings are written next to the state file (mode 0600) "
            "and their path printed (default plaintext)",
        )
    p_stop = sub.add_parser("stop", help="stop the nodes started by `start` and delete their data")
    p_stop.add_argument("--timeout", type=float, default=20.0, help="seconds before SIGKILL")
    sub.add_parser("status", help="show whether the nodes run and answer")
    for p in sub.choices.values():
        p.add_argument(
            "--libs-dir", help=f"jar cache (default ${LIBS_DIR_ENV} or {DEFAULT_LIBS_DIR})"
        )
        # Where `start` records its nodes for `stop` and `status`; tests use their own.
        p.add_argument("--state-file", default=str(DEFAULT_STATE_FILE), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    maven_args = [a for a in unknown if a.startswith("-D")]
    stray = [a for a in unknown if not a.startswith("-D")]
    if stray or (maven_args and args.command != "fetch"):
        parser.print_usage(sys.stderr)
        print(f"unrecognised arguments: {' '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "fetch":
            return _cmd_fetch(args, maven_args)
        if args.command in ("start", "start-cluster"):
            return _cmd_start(args, int(args.nodes))
        if args.command == "stop":
            return _cmd_stop(args)
        return _cmd_status(args)
    except ToolMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_MISSING_TOOL
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
