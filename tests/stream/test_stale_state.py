"""A state directory that belongs to other topics (the brokers were recreated: a local
broker's `deploy/kafka.py stop` deletes its data and keeps `.dpc-state/`): found at start,
one `error:` line naming the directory and the remedy, exit 2, no Faust ConsistencyError
traceback. Controls: a database within its changelog, one without a persisted offset and
a file that is no partition database are not stale."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from processor.stream.kafka.topics import STATE_TABLE
from processor.stream.worker.stale import OFFSET_KEY, stale_databases


def _database(path: Path, persisted: int | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(path), options=Options(raw_mode=True))
    db[b"k"] = b"v"
    if persisted is not None:
        db[OFFSET_KEY] = str(persisted).encode()
    db.close()
    return path


def test_a_database_past_its_changelogs_end_is_stale(tmp_path: Path) -> None:
    """Persisted offset >= the partition's end (the next offset): stale; below: not; a
    partition or topic the brokers lack ends at 0."""
    _database(tmp_path / "t-0.db", 41)   # end 42: applied through the last record
    _database(tmp_path / "t-1.db", 42)   # end 42: one record more than the topic has
    _database(tmp_path / "t-2.db", 0)    # the partition is not on the brokers
    _database(tmp_path / "t-3.db", None)  # nothing applied yet
    _database(tmp_path / "u-0.db", 5)    # its topic is not on the brokers
    (tmp_path / "notes.db").mkdir()      # no partition database's name
    asked: list[str] = []

    def ends(topic: str) -> Mapping[int, tuple[int, int]]:
        asked.append(topic)
        return {0: (0, 42), 1: (3, 42), 3: (0, 0)} if topic == "app-t-changelog" else {}

    found = stale_databases(tmp_path, lambda table: f"app-{table}-changelog", ends)
    assert [(d.path.name, d.topic, d.partition, d.persisted, d.end) for d in found] == [
        ("t-1.db", "app-t-changelog", 1, 42, 42),
        ("t-2.db", "app-t-changelog", 2, 0, 0),
        ("u-0.db", "app-u-changelog", 0, 5, 0)]
    assert asked == ["app-t-changelog", "app-u-changelog"]  # one look-up per topic
    assert stale_databases(tmp_path / "missing", str, ends) == []


@pytest.mark.kafka
def test_the_worker_refuses_a_state_directory_of_recreated_brokers(
        deployment_factory: Callable[..., Any]) -> None:
    """The worker finds a partition database that applied changelog offset 7 where the
    brokers' changelog is empty (new brokers): one `error:` line naming the directory,
    `rm -rf` and keygen, exit 2, within seconds, and the database is kept. Control: the
    same database without its offset is not stale on the same brokers."""
    tick = 1000
    dep = deployment_factory({"a": (int(time.time() * 1000) // tick) * tick}, tick_ms=tick)
    state = Path(dep.settings.state_dir)
    db = _database(state / dep.settings.app_id / "v1" / "tables" / f"{STATE_TABLE}-0.db", 7)
    cmd = [sys.executable, "-m", "processor", "worker", "--config", str(dep.config)]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert repr(str(state)) in lines[0] and f"rm -rf {state}" in lines[0]
    assert "keygen" in lines[0] and "Traceback" not in done.stderr
    assert db.exists() and took < 30, took
    # Control: on the same brokers, the same database without its offset is not stale.
    from processor.stream.kafka.kafka_io import end_offsets

    def ends(topic: str) -> Mapping[int, tuple[int, int]]:
        return end_offsets(dep.conf, topic)

    tables = db.parent
    named = f"{dep.settings.app_id}-{{}}-changelog".format
    assert [d.partition for d in stale_databases(tables, named, ends)] == [0]
    rd = Rdict(str(db), options=Options(raw_mode=True))
    del rd[OFFSET_KEY]
    rd.close()
    assert stale_databases(tables, named, ends) == []
