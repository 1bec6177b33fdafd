"""Replay fails fast, with one line, where it cannot reach a verdict (`python -m processor
replay`, the command line an auditor runs).

It probes the brokers first with the worker's own start rule (`kafka_io.require_brokers`):
a bootstrap server that does not answer gives one `error:` line naming it, exit code 2,
within the probe's bound plus the interpreter's start with replay's imports, measured in
the same test (not after the 120 s read timeout). A topic the configuration names that
the brokers do not have is named. A refused login or an untrusted CA is tested on the
secured brokers (tests/stream/test_secured.py). Controls: the topics that do exist are
not named, and the probe's bound is what the elapsed time is held to.
Every check is exact (no statistics).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from processor.devtools.deployment import worker_env, write_config
from processor.keyfile import write_key
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, TopicSettings, with_overrides

ROOT = Path(__file__).resolve().parents[2]
#: Beyond the probe's bound and the interpreter's start with replay's imports (measured
#: in the same test, so a loaded machine's slower start is not read as a slow probe).
SLACK_S = 3.0
#: What "fast" is told apart from: the read timeout a replay without the probe would wait.
READ_TIMEOUT_S = 120.0


def _start_s() -> float:
    """Seconds the interpreter takes, here and now, to start and import replay."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import processor.stream.replay"], check=True,
                   cwd=str(ROOT), env=worker_env(), timeout=120)
    return time.monotonic() - started


def _fail_fast_s() -> float:
    """The bound the whole command is held to: the probe's, the start's, a slack."""
    bound = kafka_io.PROBE_TIMEOUT_S + _start_s() + SLACK_S
    assert bound < READ_TIMEOUT_S / 2, f"the machine is too slow to tell: {bound:.1f} s"
    return bound


def _replay(tmp: Path, bootstrap: str, topics: TopicSettings | None = None
            ) -> tuple[subprocess.CompletedProcess[str], float]:
    key = write_key(tmp / "noise.key")
    settings = with_overrides(Settings(), bootstrap_servers=bootstrap, noise_key_file=str(key),
                              counters={"a": 0}, state_dir=str(tmp / "state"),
                              **({"topics": topics} if topics is not None else {}))
    config = write_config(settings, tmp / "replay.toml")
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "processor", "replay", "--config", str(config)],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                         env=worker_env())
    return res, time.monotonic() - started


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_brokers_fail_fast_with_one_line(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    res, took = _replay(tmp_path, bootstrap)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: replay: "), lines
    assert f"the Kafka brokers at {bootstrap} do not answer" in lines[0], lines
    bound = _fail_fast_s()
    assert took < bound, f"took {took:.1f} s, bound {bound:.1f} s"


def test_a_missing_topic_is_named(kafka_bootstrap: str, tmp_path: Path,
                                  unique_topic: Callable[[str], str],
                                  create_topics: Callable[..., None]) -> None:
    topics = TopicSettings(input=unique_topic("re-in"), timeline=unique_topic("re-tl"),
                           counts=unique_topic("re-counts"), ledger=unique_topic("re-ledger"),
                           deadletter=unique_topic("re-dead"))
    create_topics(kafka_bootstrap, [topics.timeline, topics.counts])
    res, took = _replay(tmp_path, kafka_bootstrap, topics)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: replay: "), lines
    assert repr(topics.ledger) in lines[0], lines
    # Control: the topics that exist are not named.
    assert topics.timeline not in lines[0] and topics.counts not in lines[0], lines
    bound = _fail_fast_s()
    assert took < bound, f"took {took:.1f} s, bound {bound:.1f} s"
    # And the probe did not create the missing topic (a broker may auto-create on a name).
    assert kafka_io.missing_topics({"bootstrap.servers": kafka_bootstrap},
                                   [topics.ledger]) == [topics.ledger]
