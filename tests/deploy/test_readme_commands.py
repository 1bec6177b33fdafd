"""The README's "Using it" commands, copied as written, work.

The commands are read from the README itself (its first two fenced blocks under "## Using
it"), so a change there that the tests do not follow fails here. Each line is run in a
throwaway copy of the checkout's relevant files (the README's `deploy/config.example.toml`
and `deploy/kafka.py` are the real ones) with the current Python standing in for the venv's
`python`. The cheap ones run fully: keygen (a fresh directory: `secrets/` created 0700,
the key 0600, and git-ignored in the repository), plan, count, every command's `--help`.
Against a real broker: the README's worker line (after its `export DPC_COUNTERS=...$(date
...)`, evaluated by bash) with the example configuration, pointed at the
test broker through KAFKA_BOOTSTRAP_SERVERS and at fresh topics through DPC_* overrides,
publishes a release for an event; then the README's replay line verifies it, and from a
second shell without DPC_COUNTERS says that its configuration differs (exit 3). Controls:
the command extraction finds a planted line; a keygen into an existing directory leaves
the directory's mode alone.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands(text: str, section: str = "## Using it") -> list[str]:
    """The command lines of the fenced blocks in `section` (up to the next `## `), comments
    after two spaces and `#` stripped."""
    body = text.split(section + "\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```\n(.*?)```", body, flags=re.S):
        for line in block.splitlines():
            cmd = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
            if cmd:
                out.append(cmd)
    return out


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def command(prefix: str) -> str:
    found = [c for c in COMMANDS if c.startswith(prefix) or f" {prefix}" in c]
    assert len(found) == 1, f"README's 'Using it' has no single line with {prefix!r}: {found}"
    return found[0]


def as_run(line: str) -> list[str]:
    """A README line as argv with this interpreter in place of the venv's `python`."""
    argv = shlex.split(line)
    assert argv[0] == "python", line
    return [sys.executable, *argv[1:]]


def env_here() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DPC_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's package, as the editable install is
    return env


def test_extraction_sees_the_lines_and_can_fail() -> None:
    assert any(c.startswith("python -m processor keygen") for c in COMMANDS)
    planted = "## Using it\n\n```\nfoo  # comment\n  bar baz\n```\n\n## Next\n```\nnot me\n```"
    assert readme_commands(planted) == ["foo", "bar baz"]  # control: the parser reads lines


def test_keygen_as_written_makes_a_private_dir_and_key(tmp_path: Path) -> None:
    line = command("python -m processor keygen")
    done = subprocess.run(as_run(line), cwd=tmp_path, env=env_here(), text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    key = tmp_path / shlex.split(line)[-1]
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", key.read_text())
    # The same relative path in the repository is git-ignored (never one `git add .` away).
    rel = key.relative_to(tmp_path)
    if shutil.which("git") and (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", str(rel)], cwd=ROOT,
                                 timeout=30, check=False)
        assert ignored.returncode == 0, f"{rel} is not git-ignored"
        control = subprocess.run(["git", "check-ignore", "-q", "README.md"], cwd=ROOT,
                                 timeout=30, check=False)
        assert control.returncode == 1  # the check can say "not ignored"
    # A second keygen refuses to overwrite; into an existing directory, its mode is kept.
    again = subprocess.run(as_run(line), cwd=tmp_path, env=env_here(), text=True,
                           capture_output=True, timeout=60)
    assert again.returncode == 2 and again.stderr.startswith("error: ")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    into_shared = subprocess.run(
        [sys.executable, "-m", "processor", "keygen", "shared/k/noise.key"],
        cwd=tmp_path, env=env_here(), capture_output=True, timeout=60)
    assert into_shared.returncode == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "k").stat().st_mode) == 0o700


def test_every_help_and_the_cheap_commands(tmp_path: Path) -> None:
    from processor.commands.main import _DELEGATED

    env = env_here()
    for name in ["", *_DELEGATED]:
        argv = [sys.executable, "-m", "processor", *([name] if name else []), "--help"]
        done = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("usage: python -m processor"), (
            name, done.stderr)
    (tmp_path / "ticks.txt").write_text("1\n_\n1\n_*5\n1\n")
    for prefix in ("python -m processor plan", "python -m processor count"):
        done = subprocess.run(as_run(command(prefix)), cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip(), (prefix, done.stderr)
    # The README lines that run long (audit ~15 s, the full experiment minutes) are only
    # checked to name a command; their --help ran above.
    for prefix in ("python -m processor audit", "python -m processor experiment"):
        assert as_run(command(prefix))[3] in _DELEGATED


def test_kafka_status_with_a_python_without_confluent_kafka(tmp_path: Path) -> None:
    """`python deploy/kafka.py status` with an interpreter lacking confluent_kafka (here:
    `python -S`, no site-packages) re-runs itself in the venv instead of reporting a healthy
    broker as `No module named 'confluent_kafka'`."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    if not venv_python.exists():
        pytest.skip("no .venv in the checkout (bash deploy/setup.sh makes it)")
    done = subprocess.run([sys.executable, "-S", str(ROOT / "deploy" / "kafka.py"), "status",
                           "--state-file", str(tmp_path / "none.json")],
                          text=True, capture_output=True, timeout=60)
    assert "No module named" not in done.stderr + done.stdout
    assert "running with" in done.stderr, done.stderr
    assert done.returncode == 1 and done.stdout.strip() == "not running"


def test_worker_and_replay_as_written_against_a_broker(tmp_path: Path,
                                                       kafka_bootstrap: str) -> None:
    """The README's worker line, run by bash as written (the date substitution included),
    with deploy/config.example.toml; the broker, topics, app id and state dir redirected
    to fresh ones by environment overrides (the file is used as is)."""
    from confluent_kafka import Consumer, Producer

    keygen = as_run(command("python -m processor keygen"))
    assert subprocess.run(keygen, cwd=tmp_path, env=env_here(), timeout=60).returncode == 0
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "config.example.toml", tmp_path / "deploy")
    rid = uuid.uuid4().hex[:10]
    env = env_here()
    env.update({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DPC_APP_ID": f"readme-{rid}",
                "DPC_STATE_DIR": str(tmp_path / "state"), "DPC_METRICS_PORT": "0",
                "DPC_PARTITIONS": "1"})
    topics = {r: f"readme-{r}-{rid}" for r in ("input", "timeline", "counts", "ledger",
                                               "deadletter")}
    env.update({f"DPC_TOPIC_{r.upper()}": n for r, n in topics.items()})
    # The README's export line, evaluated once by bash (the worker and replay must see the
    # same minute), then its worker line without the `&`.
    export = command("export DPC_COUNTERS=")
    value = subprocess.run(["bash", "-c", f'{export}; printf %s "$DPC_COUNTERS"'], text=True,
                           capture_output=True, timeout=30, check=True).stdout
    assert re.fullmatch(r"signups=\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", value), value
    env["DPC_COUNTERS"] = value
    line = command("python -m processor worker")
    assert line.endswith(" &"), line
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(as_run(line[:-2]), cwd=tmp_path, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"t-{rid}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topics["counts"]])
        deadline = time.monotonic() + 120
        got = None
        while got is None and time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            producer.produce(topics["input"],
                             f'{{"counter": "signups", "ts": {int(time.time() * 1000)}}}')
            producer.poll(0)
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got = msg.value()
        consumer.close()
        producer.flush(10)
        assert got is not None and b'"signups"' in got, (
            (tmp_path / "worker.log").read_text()[-3000:])
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
    replay = as_run(command("python -m processor replay"))
    done = subprocess.run(replay, cwd=tmp_path, env=env, text=True, capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # The same replay from a second shell that lacks the README's DPC_COUNTERS (the
    # example file's counters instead): its first line names the mismatch, exit 3.
    second_shell = {k: v for k, v in env.items() if k != "DPC_COUNTERS"}
    done = subprocess.run(replay, cwd=tmp_path, env=second_shell, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("CONFIGURATION DIFFERS from the ledger's: counters "
                                  "incidents, test_results are configured but on no ledger "
                                  "entry"), done.stdout
