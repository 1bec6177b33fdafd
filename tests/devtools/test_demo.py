"""The demo's user experience, end to end on the real broker (`python -m processor demo`).

Ctrl-C as a terminal sends it (SIGINT to the whole process group, the worker included)
takes the demo's own clean path: exit 0, a summary, no "worker exited unexpectedly". The
live view it starts answers while it runs and is gone after. A librdkafka warning (provoked
with a bootstrap list whose second server refuses connections) never reaches the table: it
goes through Python logging into the run directory. At exit the topics and the run
directory are kept, with the commands to look at, audit and delete them; `--delete` then
removes both. The controls: the same run's output does contain the table rows, the legend
and the summary lines that the assertions look for.

A SIGKILL of the demo (no clean path at all) still leaves none of its processes: the worker
and the view get SIGTERM from the kernel (`die_with_parent`); the demo on a given broker
starts no broker of its own (the `deploy/kafka.py start` broker is detached on purpose: it
keeps the topics after the demo). Control: the same check reports an unwrapped child that
outlives its killed parent.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from processor.stream.kafka import kafka_io
from tests.devtools.procs import cmdline, descendants, program, running, survivors

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\d\d:\d\d:\d\d (signups|purchases|incidents) ")


def _read_until(proc: subprocess.Popen[str], lines: list[str], pattern: re.Pattern[str],
                timeout_s: float) -> str:
    """Read the demo's stdout into `lines` until a line matches; fail at the deadline."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if pattern.search(line):
                return line
    pytest.fail(f"no line matching {pattern.pattern!r} in time:\n{''.join(lines)}")


def test_ctrl_c_is_clean_and_the_run_is_kept(kafka_bootstrap: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    bootstrap = f"{kafka_bootstrap},127.0.0.1:1"  # the second server refuses: librdkafka warns
    proc = subprocess.Popen(
        [sys.executable, "-m", "processor", "demo", "--seconds", "120", "--tick-ms", "200",
         "--lateness-ms", "200", "--bootstrap", bootstrap, "--view-port", "0",
         "--metrics-port", "0", "--runs-dir", str(runs)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True)  # its own process group: killpg = a terminal's ^C
    lines: list[str] = []
    try:
        metrics = _read_until(proc, lines, re.compile(r"^worker metrics: "), 60).split()[2]
        url = _read_until(proc, lines, re.compile(r"^live view: "), 60).split()[2]
        with urllib.request.urlopen(url + "api/meta", timeout=10) as resp:
            assert b"signups" in resp.read()
        # The demo's worker serves its operator metrics at the printed URL (once it runs:
        # the line is printed when its process starts).
        _read_until(proc, lines, ROW, 60)
        with urllib.request.urlopen(metrics, timeout=10) as resp:
            assert b"# HELP dpc_" in resp.read()
        _read_until(proc, lines, ROW, 60)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = "".join(lines) + out
    assert proc.returncode == 0, (text, err)
    assert "worker exited unexpectedly" not in text + err
    assert "Traceback" not in err, err
    assert "stopped by Ctrl-C" in text and "kept for you" in text, text
    # The legend line comes right before the table's header.
    legend = [i for i, line in enumerate(text.splitlines()) if line.startswith("legend: ")]
    assert legend and text.splitlines()[legend[0] + 1].startswith("time "), text
    for word in ("bound", "beta", "heartbeat", "change"):
        assert word in text.splitlines()[legend[0]]
    # The line before it says what the viewer sees and what trades error for privacy, at
    # the demo's default privacy level (eps 10, SimECC, tight).
    explain = text.splitlines()[legend[0] - 1]
    assert explain.startswith("what you see: ") and "lags the truth" in explain, explain
    assert "--epsilon" in explain and "eps 10 per event" in explain, explain
    assert "(simecc, tight calibration, eps=10.0," in text, text
    # No librdkafka line anywhere on the terminal; they went to the run's log file.
    assert not re.search(r"%\d\|\d+\.\d+\|", text + err), text + err
    run_dir = Path(re.search(r"--delete (\S+)", text).group(1))  # type: ignore[union-attr]
    assert (run_dir / "worker.toml").is_file()
    # librdkafka tries a bootstrap server only when it picks it (at random), so whether
    # the refusing one was tried in this run is chance: whatever the clients logged, not
    # a line of it (raw or through Python logging) reached the terminal.
    # test_client_lines_go_to_the_run_log pins the routing into the run's log itself.
    assert not re.search(r"rdkafka|thrd:|Connect to ipv", text + err), text + err
    with pytest.raises(urllib.error.URLError):  # the view stopped with the demo
        urllib.request.urlopen(url + "healthz", timeout=5)

    # The topics were kept, and --delete removes them with the directory.
    conf = {"bootstrap.servers": kafka_bootstrap}
    uid = run_dir.name.removeprefix("dpc-demo-")
    def demo_topics() -> list[str]:
        return [t for t in kafka_io.make_admin(conf).list_topics(timeout=30).topics
                if t.endswith(uid)]
    assert len(demo_topics()) == 5
    done = subprocess.run([sys.executable, "-m", "processor", "demo", "--delete", str(run_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not run_dir.exists()
    deadline = time.monotonic() + 30
    while demo_topics():
        assert time.monotonic() < deadline, demo_topics()
        time.sleep(0.2)


_needs_setpriv = pytest.mark.skipif(
    shutil.which("setpriv") is None or not sys.platform.startswith("linux"),
    reason="needs util-linux setpriv on Linux")


def _exec_all(pids: list[int], timeout_s: float = 10.0) -> None:
    """Wait until every running process of `pids` has finished its exec: it is no longer
    setpriv (which asks for the signal just before it execs the real program) and its
    command line is readable. The kernel switches /proc/<pid>/exe before it sets up the
    new program's arguments, so for a moment a process shows its new executable and an
    empty command line (a loaded CI machine caught the test reading it then)."""
    deadline = time.monotonic() + timeout_s
    while any(running(pid) and (program(pid) == "setpriv" or not cmdline(pid))
              for pid in pids):
        assert time.monotonic() < deadline, [cmdline(pid) for pid in pids]
        time.sleep(0.02)


@_needs_setpriv
def test_sigkill_of_the_demo_leaves_no_process(kafka_bootstrap: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "processor", "demo", "--seconds", "120", "--tick-ms", "200",
         "--lateness-ms", "200", "--bootstrap", kafka_bootstrap, "--view-port", "0",
         "--metrics-port", "0", "--runs-dir", str(runs)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True)
    lines: list[str] = []
    children: list[int] = []
    try:
        _read_until(proc, lines, re.compile(r"^live view: "), 60)
        _read_until(proc, lines, ROW, 60)  # the worker runs: it released
        children = descendants(proc.pid)
        _exec_all(children)
        roles = {pid: " ".join(cmdline(pid)) for pid in children}
        assert any("processor worker" in c for c in roles.values()), roles
        assert any("processor view" in c for c in roles.values()), roles
        assert not any(program(pid) == "java" for pid in children), roles  # no broker
        proc.kill()
        proc.wait(10)
        left = survivors(children, 30.0)
        assert not left, {pid: roles[pid] for pid in left}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in children:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    for run_dir in runs.glob("dpc-demo-*"):  # its topics on the shared broker
        subprocess.run([sys.executable, "-m", "processor", "demo", "--delete", str(run_dir)],
                       cwd=ROOT, capture_output=True, timeout=120, check=True)


@_needs_setpriv
def test_the_survivor_check_sees_an_unwrapped_child() -> None:
    """Control for the test above: of two `sleep`s, one wrapped with die_with_parent and
    one not, the unwrapped one is found below the parent and outlives it."""
    script = ("import subprocess, sys\n"
              "from processor.devtools.kafka.tools import die_with_parent\n"
              "subprocess.Popen(die_with_parent(['sleep', '60'], 'TERM'))\n"
              "subprocess.Popen(['sleep', '61'])\n"
              "print('ok', flush=True)\n"
              "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert parent.stdout is not None and parent.stdout.readline() == "ok\n"
    children = descendants(parent.pid)
    try:
        _exec_all(children)
        assert sorted(cmdline(pid)[-1] for pid in children) == ["60", "61"]
        parent.kill()
        parent.wait(10)
        left = survivors(children, 3.0)  # the wrapped sleep goes at once (SIGTERM)
        assert [cmdline(pid)[-1] for pid in left] == ["61"]
    finally:
        parent.kill()
        parent.wait(10)
        for pid in children:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_client_lines_go_to_the_run_log(tmp_path: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    """The demo's Kafka clients log through its client logger: a client of a closed port
    logs its connection failures into the lines the demo keeps and saves as
    demo-clients.log, and nothing of librdkafka reaches stderr. Control: nothing
    collected means no file."""
    from processor.devtools.demo import _client_logger, _ClientLogs

    handler = _ClientLogs()
    assert handler.save(tmp_path / "empty.log") is None
    logger = _client_logger(handler)
    conf: dict[str, Any] = {"bootstrap.servers": "127.0.0.1:9", "reconnect.backoff.ms": "50",
                            "logger": logger}
    producer = kafka_io.make_producer(conf)
    deadline = time.monotonic() + 15
    while not any("127.0.0.1:9" in line for line in handler.lines) \
            and time.monotonic() < deadline:
        producer.poll(0.1)
    del producer
    saved = handler.save(tmp_path / "demo-clients.log")
    assert saved is not None and "127.0.0.1:9" in saved.read_text()
    assert not re.search(r"%\d\|\d+\.\d+\|", capfd.readouterr().err)


def test_the_demo_names_its_broker_and_takes_the_readmes_port_when_free(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a running local broker the demo starts one on the README's port 9092 when
    it is free (so the walk-through's `kafka.py start --ports 9092` finds it), on a free
    port otherwise, and prints the address; a running one is named too. Control: with
    9092 taken no --ports is asked for."""
    import subprocess as sp

    from processor.devtools import demo

    asked: list[list[str]] = []

    def run(cmd: list[str], **kw: object) -> sp.CompletedProcess[str]:
        asked.append(cmd)
        return sp.CompletedProcess(cmd, 0, stdout="127.0.0.1:9092\n")

    monkeypatch.setattr(sp, "run", run)
    monkeypatch.setattr(demo, "_read_broker_state", lambda: None)
    for free in (True, False):
        monkeypatch.setattr(demo, "_port_free", lambda port, free=free: free)
        assert demo._local_broker() == ("127.0.0.1:9092", True)
        assert asked[-1][2:] == (["start", "--ports", "9092"] if free else ["start"])
        assert "local Kafka broker at 127.0.0.1:9092" in capsys.readouterr().out
    monkeypatch.setattr(demo, "_read_broker_state", lambda: "127.0.0.1:4321")
    assert demo._local_broker() == ("127.0.0.1:4321", False)
    assert "using the local Kafka broker at 127.0.0.1:4321" in capsys.readouterr().out
