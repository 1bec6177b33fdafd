"""Shared helpers of the local broker: where its files live, its errors, tools on PATH,
ports, cluster ids, the child-process wrapper and the sweep of abandoned directories."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path

from processor.errors import ProcessorError

#: The checkout's deploy/ directory: pom.xml, log4j settings, the jar cache.
DEPLOY_DIR = Path(__file__).resolve().parents[3] / "deploy"
POM_FILE = DEPLOY_DIR / "kafka" / "pom.xml"
LOG4J_FILE = DEPLOY_DIR / "kafka" / "log4j.properties"
DEFAULT_LIBS_DIR = DEPLOY_DIR / ".cache" / "kafka-libs"
DEFAULT_STATE_FILE = DEPLOY_DIR / ".cache" / "run" / "local-kafka.json"
#: Prefix of every node directory under the temporary directory (sweep_stale_dirs).
DIR_PREFIX = "local-kafka-"

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


class LocalKafkaError(ProcessorError, RuntimeError):
    """Base class of every error this package raises on purpose."""

    exit_code = 1


class ToolMissingError(LocalKafkaError):
    """``java`` or ``mvn`` is not on PATH, so the local broker cannot be fetched or run."""

    #: Its own code, so that a caller can tell "install java or mvn" from a failure.
    exit_code = 3

    def __init__(self, tool: str) -> None:
        self.tool = tool
        hint = _INSTALL_HINTS.get(tool, "install it")
        super().__init__(f"`{tool}` was not found on PATH: {hint}")


class BrokerStartError(LocalKafkaError):
    """A node did not come up in time or exited; the message ends with the tail of its log.
    (Not the worker's processor.stream.app.StartError: this one is the local broker's.)"""


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
    for path in root.glob(f"{DIR_PREFIX}*-*"):
        owner = path.name[len(DIR_PREFIX) :].split("-", 1)[0]
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
