"""Child processes of the stream benchmark and what they cost: CPU-seconds of a process
tree (user + system, psutil) and per thread group (/proc/<pid>/task/*/stat), resident
memory, the machine's busy fraction, state directory sizes, worker log findings."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from processor.devtools.deployment import Deployment

_NOTABLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def log_findings(dep: Deployment) -> dict[str, Any]:
    """Warning/error lines of a deployment's worker logs: their count and a few distinct
    ones (digits folded). The worker never logs values or secrets, so they can be shown."""
    found: list[str] = []
    for w in dep.workers:
        with contextlib.suppress(OSError):
            found += [line.strip() for line in w.log_path.read_text(errors="replace")
                      .splitlines() if _NOTABLE.search(line)]
    distinct = list(dict.fromkeys(re.sub(r"\d+", "N", line)[:200] for line in found))
    return {"count": len(found), "examples": distinct[:3]}


class Children:
    """Child processes of the bench (baselines and workers), stopped on every exit path."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.deployments: list[Deployment] = []

    def spawn(self, cmd: Sequence[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
        """Start `cmd` (a whole command line) with its output in `log`."""
        with open(log, "ab") as fh:
            proc = subprocess.Popen(list(cmd),
                                    stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(cwd))
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if proc in self.procs:
            self.procs.remove(proc)

    def close_deployment(self, dep: Deployment) -> dict[str, Any]:
        """Stop its workers; what their logs say at warning level and above."""
        dep.close()
        if dep in self.deployments:
            self.deployments.remove(dep)
        return log_findings(dep)

    def close(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)
        for dep in list(self.deployments):
            self.close_deployment(dep)


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None, native: bool = False) -> Iterator[None]:
    """py-spy record of `pid` (every thread on the CPU, raw stacks, non-blocking) while the
    block runs, into `out`; nothing when `out` is None. Stopped by SIGINT at the block's
    end (py-spy then writes its file). py-spy is installed next to this interpreter, not a
    dependency of the project. Its own CPU is in no system's figure, but it shares the
    machine: a profiled stage's figures are not a measurement."""
    if out is None:
        yield
        return
    cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "--threads",
           "--nonblocking", "--format", "raw", "--rate", "200", "-o", str(out),
           "-p", str(pid)]
    if native:
        cmd.append("--native")
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def _proc_tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pid: int) -> float:
    """CPU-seconds `pid` and its children have run so far, to the nanosecond: the sum of
    their threads' time on a CPU (/proc/<pid>/task/*/schedstat). The user + system times
    of stat(5) count in clock ticks (10 ms), coarser than the whole CPU a small bench
    stage of the plain confluent-kafka loop takes (it read 0.0 for 4,000 events on a
    loaded machine). A thread that ended between two readings is missing from the later
    one; the measured processes keep their threads for the run (librdkafka's, RocksDB's,
    the executors'). Where schedstat cannot be read, psutil's tick-based times."""
    total = 0.0
    for p in _proc_tree(pid):
        try:
            tasks = list(Path(f"/proc/{p.pid}/task").iterdir())
            for task in tasks:
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
    return total


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_group(tid: int, pid: int, comm: str) -> str:
    """Which part of a worker a thread is, by its kernel name: the main thread runs
    Faust's event loop (the operator agent, timers, aiokafka clients); librdkafka names
    its threads rdk:*, RocksDB rocksdb:*; the other Python threads are the ingest loop,
    the lag probe, the endpoints' server and executor threads (Python does not name
    its threads for the kernel, so they are one group)."""
    if tid == pid:
        return "main"
    if comm.startswith("rdk:"):
        return "librdkafka"
    if comm.startswith("rocksdb"):
        return "rocksdb"
    return "other python"


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds (user + system) of the threads of `pid` and its children so far, by
    `thread_group` (from /proc/<pid>/task/*/stat). A thread that ended between two
    readings is missing from the later one, so differences are per group, never negative
    by more than such a thread's time (the workers' threads live as long as they do)."""
    out: dict[str, float] = {}
    for p in _proc_tree(pid):
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = (task / "stat").read_text()
                comm = raw[raw.index("(") + 1:raw.rindex(")")]
                fields = raw[raw.rindex(")") + 2:].split()
                # fields[11], fields[12]: utime, stime (stat(5) fields 14 and 15)
                cpu = (int(fields[11]) + int(fields[12])) * _TICK_S
                group = thread_group(int(task.name), pid, comm)
                out[group] = out.get(group, 0.0) + cpu
    return out


def cpu_diff(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in sorted(set(a) | set(b))}


def rss_bytes(pid: int) -> int:
    total = 0
    for p in _proc_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def machine_busy(t0: Any, t1: Any) -> float:
    """Fraction of the machine's CPU time that was not idle between two psutil.cpu_times()."""
    total = sum(t1) - sum(t0)
    idle = (t1.idle - t0.idle) + (getattr(t1, "iowait", 0.0) - getattr(t0, "iowait", 0.0))
    return float(1.0 - idle / total) if total > 0 else float("nan")


def dir_sizes(path: Path) -> dict[str, int]:
    """Bytes under `path` (file sizes): SST files, write-ahead logs, everything else; and
    "disk", the blocks allocated (what du counts: it includes preallocated space)."""
    out = {"sst": 0, "wal": 0, "other": 0}
    disk = 0
    for f in path.rglob("*"):
        if f.is_file():
            kind = "sst" if f.suffix == ".sst" else "wal" if f.suffix == ".log" else "other"
            with contextlib.suppress(OSError):
                st = f.stat()
                out[kind] += st.st_size
                disk += st.st_blocks * 512
    return {**out, "disk": disk}


_DB_RE = re.compile(r"-(\d+)\.db$")


def partition_dbs(path: Path) -> dict[int, int]:
    """timeline partition -> bytes of its RocksDB directory under a worker's state dir."""
    out: dict[int, int] = {}
    for d in path.rglob("*.db"):
        m = _DB_RE.search(d.name)
        if d.is_dir() and m:
            out[int(m.group(1))] = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    return out


def pcts(xs: Sequence[float]) -> tuple[float, float, float]:
    if not xs:
        return (float("nan"),) * 3
    s = sorted(xs)
    return (s[len(s) // 2], s[min(len(s) - 1, int(0.95 * len(s)))], s[-1])


def scrape_metrics(port: int, timeout_s: float = 5.0,
                   only: str | None = None) -> dict[str, float]:
    """The samples on the Prometheus endpoint 127.0.0.1:port/metrics, by series (a name,
    with its labels if it has any; empty: the page did not answer within `timeout_s`).
    `only`: the series of that name alone (Prometheus's `name[]` filter: the worker
    renders that metric only, a third of a whole page's CPU)."""
    import urllib.parse
    import urllib.request

    query = "" if only is None else "?" + urllib.parse.urlencode({"name[]": only})
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}",
                                    timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#"):
            try:
                out[name] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return out


def scrape_counter(port: int, name: str, timeout_s: float = 5.0) -> float | None:
    """The value of the metric `name` on the Prometheus endpoint 127.0.0.1:port/metrics
    (None: not served yet, or not there)."""
    return scrape_metrics(port, timeout_s, only=name).get(name)
