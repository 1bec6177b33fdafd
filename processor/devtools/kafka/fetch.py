"""Fetch the broker jars from Maven Central into a cache directory (stdlib only: deploy/
setup.sh may run it with a bare interpreter)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from processor.devtools.kafka.tools import (
    DEFAULT_LIBS_DIR,
    DEPLOY_DIR,
    POM_FILE,
    LocalKafkaError,
    require_tool,
    tail,
)

# Environment overrides (documented in deploy/README.md).
LIBS_DIR_ENV = "LOCAL_KAFKA_LIBS"
MAVEN_ARGS_ENV = "LOCAL_KAFKA_MAVEN_ARGS"

_STAMP_NAME = ".fetched"
_KAFKA_JAR_PREFIX = "kafka_2.13-"


class FetchError(LocalKafkaError):
    """Maven could not download the broker jars; the message ends with Maven's output."""


def default_libs_dir() -> Path:
    """The jar cache: $LOCAL_KAFKA_LIBS if set, else deploy/.cache/kafka-libs."""
    env = os.environ.get(LIBS_DIR_ENV)
    return Path(env).expanduser().resolve() if env else DEFAULT_LIBS_DIR


def pom_fingerprint() -> str:
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
    return has_kafka and recorded == pom_fingerprint()


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
            (part / _STAMP_NAME).write_text(pom_fingerprint() + "\n", encoding="ascii")
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
