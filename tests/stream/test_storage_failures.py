"""On the real broker: a full disk, an unwritable state directory and a
corrupt local state file each stop the worker with ONE `error:` line naming the cause,
the path and the remedy (no traceback), and the restart after the remedy loses nothing
(replay identical). The disks are small tmpfs mounts (root only; CI runs as root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.stream.kafka.topics import changelog_topic
from processor.stream.replay import replay
from processor.stream.worker.app import MIN_FREE_BYTES
from tests.stream.refusals import one_error_line

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (needs root)")


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int, *, read_only: bool = False) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size_mib}m" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _deployment(factory: Callable[..., Any], name: str, state_dir: Path) -> Any:
    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    return factory({"a": start, "b": start}, name=name, partitions=2, tick_ms=tick,
                   lateness_ms=200, heartbeat_ticks=5, epsilon=500.0,
                   state_dir=str(state_dir))


@pytest.mark.kafka
def test_a_full_disk_stops_the_worker_with_one_line_and_the_restart_loses_nothing(
        deployment_factory: Callable[..., Any], tmp_path: Path) -> None:
    """The state directory's disk fills while the worker runs: exit 1, one line with
    "full", the path and the remedy. Freed, the restart publishes on and replay finds
    the published stream identical. Control: before the disk filled, it ran."""
    with tmpfs(tmp_path / "disk", 128) as disk:
        dep = _deployment(deployment_factory, "fulldisk", disk / "state")
        dep.worker.start()
        dep.wait_releases(lambda rs: len(rs) >= 4, timeout_s=120)
        assert dep.worker.alive()
        filler = disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(filler, "wb") as f:
            f.write(b"\0" * (free - MIN_FREE_BYTES // 2))
        code, log = dep.worker.wait_exit(timeout_s=60)
        assert code == 1, log
        line = one_error_line(log)
        assert "is full" in line and str(disk) in line and "Remedy" in line, line
        assert changelog_topic(dep.settings) in line, line
        filler.unlink()
        before = len(dep.releases())
        dep.worker.start()
        dep.wait_releases(lambda rs: len(rs) >= before + 6, timeout_s=120)
        assert dep.worker.stop() == 0, dep.worker.log_tail()
        report = replay(dep.settings, dep.key)
        assert report.identical, report.summary()


@pytest.mark.kafka
def test_an_unwritable_state_directory_is_one_line_exit_2(
        deployment_factory: Callable[..., Any], tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", 8, read_only=True) as ro:
        dep = _deployment(deployment_factory, "rodisk", ro / "state")
        dep.worker.start()
        code, log = dep.worker.wait_exit(timeout_s=60)
        assert code == 2, log
        line = one_error_line(log)
        assert "cannot be written" in line and str(ro) in line and "Remedy" in line, line


@pytest.mark.kafka
def test_a_corrupt_local_file_is_one_line_and_the_restart_rebuilds(
        deployment_factory: Callable[..., Any], tmp_path: Path) -> None:
    """After a clean stop, every data file of the local databases has bytes flipped: the
    restart stops with one line naming the corruption, the path and the remedy (exit 1);
    the next restart rebuilds from the changelog, publishes on, replay identical."""
    dep = _deployment(deployment_factory, "corrupt-local", tmp_path / f"st-{uuid.uuid4().hex[:6]}")
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) >= 6, timeout_s=120)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    flipped = 0
    for f in (Path(dep.settings.state_dir) / dep.settings.app_id).rglob("*"):
        if f.is_file() and (f.suffix in (".sst", ".log") or f.name.startswith("MANIFEST")):
            data = bytearray(f.read_bytes())
            if len(data) > 64:
                for i in range(16, len(data) - 16, 7):
                    data[i] ^= 0x55
                f.write_bytes(bytes(data))
                flipped += 1
    assert flipped, "no local database file found"
    dep.worker.start()
    code, log = dep.worker.wait_exit(timeout_s=90)
    assert code == 1, log
    line = one_error_line(log)
    assert "corrupt" in line and dep.settings.app_id in line and "Remedy" in line, line
    before = len(dep.releases())
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) >= before + 6, timeout_s=120)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    report = replay(dep.settings, dep.key)
    assert report.identical, report.summary()
