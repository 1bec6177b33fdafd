"""An isolated deployment of the processor for the demo, the tests and the benchmarks.

`isolated_deployment(bootstrap, counters, ...)` builds everything one run needs and nothing
any other run shares:

- an app id and five topic names with a random suffix (so consumer groups, changelogs and
  topics never collide with another run on the same broker);
- a directory holding the noise key file (mode 0600, written by the one key writer,
  `processor.keyfile.write_key`), the worker's state dir, its config file (rendered from the
  `Settings`, so the worker reads exactly what the caller built) and its log;
- the topics, created with the configured partition count (optional);
- a `WorkerProcess` handle: `python -m processor worker --config F` as a child process,
  not started.

`Deployment.close()` (or leaving its `with` block) stops every worker it made and deletes
the directory if the helper created it. The worker's environment is the caller's minus every
variable `load_settings` reads (`SETTINGS_ENV_VARS`), so a stray `DPC_EPSILON` in a
developer's shell cannot make the worker run other settings than the config file says.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from processor.core.rng import NoiseKey
from processor.devtools.kafka.tools import die_with_parent
from processor.keyfile import read_key, write_key
from processor.stream.kafka import kafka_io
from processor.stream.model.config import (
    SETTINGS_ENV_VARS,
    SecuritySettings,
    Settings,
    TopicSettings,
    with_overrides,
)

#: The checkout's root: the worker child runs there (`python -m processor`).
ROOT = Path(__file__).resolve().parents[2]


# --- configuration files ---------------------------------------------------------------

def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    # A JSON string of printable text is a valid TOML basic string.
    return orjson.dumps(str(v)).decode()


#: Settings fields of privacy_unit = "user" -> their names in the [unit] section.
_UNIT_FIELDS = {"unit_epsilon": "epsilon", "unit_delta": "delta",
                "max_events_per_counter": "max_events_per_counter",
                "max_counters_per_unit": "max_counters_per_unit",
                "unit_derivation": "derivation",
                "unit_confirm_migration": "confirm_migration"}


def render_toml(settings: Settings) -> str:
    """A TOML configuration that `load_settings` reads back as `settings`."""
    lines: list[str] = []
    user = settings.privacy_unit == "user"
    # The unit target lives in a [unit] section; in user mode epsilon/delta are derived
    # from it and must not be written (docs/privacy-unit.md).
    skip = {"security", "topics", "counters", "families", *_UNIT_FIELDS} | (
        {"epsilon", "delta"} if user else set())
    for f in fields(Settings):
        if f.name in skip:
            continue
        v = getattr(settings, f.name)
        if v is not None:
            lines.append(f"{f.name} = {_toml_value(v)}")
    if user:
        lines.append("[unit]")
        for name, toml_name in _UNIT_FIELDS.items():
            lines.append(f"{toml_name} = {_toml_value(getattr(settings, name))}")
    lines.append("[security]")
    for f in fields(SecuritySettings):
        v = getattr(settings.security, f.name)
        if v is not None:
            lines.append(f"{f.name} = {_toml_value(v)}")
    lines.append("[topics]")
    for f in fields(TopicSettings):
        lines.append(f"{f.name} = {_toml_value(getattr(settings.topics, f.name))}")
    lines.append("[counters]")
    for name, start in settings.counters.items():
        lines.append(f"{_toml_value(name)} = {int(start)}")
    if settings.families:
        lines.append("[families]")
        for name, fam in settings.families.items():
            lines.append(f"{_toml_value(name)} = {{ open = true, start = {fam.start_ms}, "
                         f"selection_delta = {fam.selection_delta!r} }}")
    return "\n".join(lines) + "\n"


def write_config(settings: Settings, path: str | os.PathLike[str]) -> Path:
    """Write `render_toml(settings)` to `path` (mode 0600: it may hold a SASL password)."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(render_toml(settings))
    return p


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) without the settings overrides."""
    src = os.environ if base is None else base
    return {k: v for k, v in src.items() if k not in SETTINGS_ENV_VARS}


# --- the worker as a child process -----------------------------------------------------

class WorkerProcess:
    """`python -m processor worker --config F` as a child process.

    stop() sends SIGTERM (a graceful Faust shutdown); kill() sends SIGKILL (a crash).
    Output goes to `log_path`, never to the caller's terminal. `env` is the child's whole
    environment (default: `worker_env()`, i.e. this one without settings overrides).
    With `dies_with_parent` set (before start()), the kernel sends it SIGTERM, its clean
    stop, when the process that started it goes, even killed (the demo sets it).
    """

    def __init__(self, config_path: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 *, loglevel: str = "warning", env: Mapping[str, str] | None = None) -> None:
        self.config_path = str(config_path)
        self.log_path = Path(log_path)
        self.loglevel = loglevel
        self.env = worker_env() if env is None else dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0
        self.dies_with_parent = False

    def start(self) -> WorkerProcess:
        if self.alive():
            raise RuntimeError("worker already running")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=str(ROOT), env=self.env)
        self.starts += 1
        return self

    def command(self) -> list[str]:
        """The worker's command line."""
        cmd = [sys.executable, "-m", "processor", "worker", "--config", self.config_path,
               "--loglevel", self.loglevel]
        return die_with_parent(cmd, "TERM") if self.dies_with_parent else cmd

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crashed machine process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap(30.0)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self._reap(30.0)

    def wait_exit(self, timeout_s: float = 120.0, tail: int = 200) -> tuple[int, str]:
        """Wait for the worker to exit by itself (a refusal, a failure, a test crash point);
        returns (exit code, the last `tail` lines of its log), the process reaped and its
        log closed. AssertionError with the log when it is still running after
        `timeout_s`."""
        if self.proc is None:
            raise AssertionError("the worker was never started")
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker kept running for {timeout_s:.0f} s:\n"
                                 + self.log_tail()) from None
        code = self._reap(30.0)
        return code, self.log_tail(tail)

    def _reap(self, timeout_s: float) -> int:
        code = 0
        if self.proc is not None:
            code = self.proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return int(code)

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- one isolated deployment -----------------------------------------------------------

def group_assignment(conf: Mapping[str, str], group: str,
                     topic: str) -> dict[str, list[int]]:
    """member id -> partitions of `topic` it holds, from the broker's group description."""
    admin = kafka_io.make_admin(conf)
    desc = admin.describe_consumer_groups([group], request_timeout=30)[group].result(timeout=30)
    return {str(m.member_id): sorted(int(tp.partition) for tp in m.assignment.topic_partitions
                                     if tp.topic == topic)
            for m in desc.members}


def isolated_topics(name: str, uid: str) -> TopicSettings:
    """Five topic names that start with `name` and end with the run's unique `uid`."""
    return TopicSettings(input=f"{name}-in-{uid}", timeline=f"{name}-tl-{uid}",
                         counts=f"{name}-counts-{uid}", ledger=f"{name}-ledger-{uid}",
                         deadletter=f"{name}-dead-{uid}")


@dataclass
class Deployment:
    """One isolated run: settings, its files, a client config and its worker processes."""

    settings: Settings
    #: Holds the key, the config file(s), the state dir(s) and the worker logs.
    directory: Path
    #: The config file of the first worker (`worker`).
    config: Path
    key: NoiseKey
    #: librdkafka client configuration for this deployment's broker (security included).
    conf: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)
    #: Whether close() deletes `directory` (True when the helper created it).
    owns_directory: bool = False

    @property
    def topics(self) -> TopicSettings:
        return self.settings.topics

    @property
    def worker(self) -> WorkerProcess:
        """The first worker (made with the deployment, not started)."""
        return self.workers[0]

    def add_worker(self, label: str, *, loglevel: str = "warning",
                   env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerProcess:
        """Another worker of the same app (same group, topics and key) with its own state
        dir `<label>-state`, config `<label>.toml` and log `<label>.log`; not started.
        `overrides` change further settings of this worker alone (e.g. the network
        partition campaign's `bootstrap_servers`, a proxy's address)."""
        settings = with_overrides(self.settings,
                                  state_dir=str(self.directory / f"{label}-state"),
                                  **overrides)
        config = write_config(settings, self.directory / f"{label}.toml")
        worker = WorkerProcess(config, self.directory / f"{label}.log", loglevel=loglevel,
                               env=env)
        self.workers.append(worker)
        return worker

    def produce(self, values: Iterable[bytes]) -> int:
        """Produce raw input records (no key) and wait for every ack; returns the count."""
        return kafka_io.produce_all(self.conf, self.topics.input, ((None, v) for v in values))

    def releases(self) -> list[dict[str, Any]]:
        """Every release published so far, decoded, in partition then offset order."""
        return [orjson.loads(r.value) for r in kafka_io.iter_topic(self.conf, self.topics.counts)
                if r.value]

    def wait_releases(self, pred: Callable[[list[dict[str, Any]]], bool],
                      timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Tail the private-count topic until pred(all decoded releases) holds.

        AssertionError with the tail of the first worker's log at the deadline.
        """
        def check(recs: list[kafka_io.KafkaRecord]) -> bool:
            return pred([orjson.loads(r.value) for r in recs if r.value])
        try:
            recs = kafka_io.wait_for(self.conf, self.topics.counts, check, timeout_s=timeout_s)
        except TimeoutError:
            raise AssertionError("releases did not arrive in time; worker log:\n"
                                 + self.worker.log_tail()) from None
        return [orjson.loads(r.value) for r in recs if r.value]

    def close(self) -> None:
        """Stop every worker (SIGTERM, SIGKILL after a timeout); delete an owned directory.

        The topics stay (their names are unique; tests read them after the workers stop).
        """
        for worker in self.workers:
            worker.stop()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def isolated_deployment(bootstrap: str, counters: Mapping[str, int], *,
                        parent: str | os.PathLike[str] | None = None, name: str = "dpc",
                        secret: bytes | None = None, create_topics: bool = True,
                        loglevel: str = "warning", env: Mapping[str, str] | None = None,
                        base: Settings | None = None, **overrides: Any) -> Deployment:
    """Build an isolated deployment on the broker at `bootstrap` (see the module docstring).

    `counters` are the declared counters (name -> start, epoch ms). The files go to a new
    directory `<name>-<uid>` inside `parent` (kept after close(): a test's tmp_path, say),
    or, without `parent`, to a fresh temporary directory that close() deletes. `name`
    prefixes the app id and the topics; `secret` is the noise key's secret (default: a
    fresh random key); `base` the settings to start from (default `Settings()`) and
    `overrides` any further fields. `env` is the worker's environment (default
    `worker_env()`). The worker is created, not started. Creating topics needs the broker.
    """
    uid = uuid.uuid4().hex[:10]
    if parent is None:
        root = Path(tempfile.mkdtemp(prefix=f"{name}-{uid}-"))
    else:
        root = Path(parent) / f"{name}-{uid}"
        root.mkdir(parents=True)
    try:
        key_file = write_key(root / "noise.key", secret, overwrite=False)
        fields_: dict[str, Any] = dict(
            app_id=f"{name}-app-{uid}", bootstrap_servers=bootstrap,
            topics=isolated_topics(name, uid), counters=dict(counters),
            noise_key_file=str(key_file), state_dir=str(root / "state"),
            # No metrics listener unless asked for: several deployments share one host
            # (tests, the bench's two workers), and a fixed port would collide.
            metrics_port=0)
        fields_.update(overrides)
        settings = with_overrides(base if base is not None else Settings(), **fields_)
        config = write_config(settings, root / "worker.toml")
        if create_topics:
            from processor.stream.worker.app import ensure_topics  # Faust: only when needed

            ensure_topics(settings)
        worker = WorkerProcess(config, root / "worker.log", loglevel=loglevel, env=env)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # a new directory: nothing of the caller's
        raise
    return Deployment(settings=settings, directory=root, config=config,
                      key=read_key(key_file), conf=kafka_io.base_config(settings),
                      workers=[worker], owns_directory=parent is None)
