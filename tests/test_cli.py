"""The command line as one dispatcher (processor/commands/main.py): every subcommand in its table,
help for every option of every subcommand, `--version` from the package metadata, and one
error policy: a bad invocation of any subcommand is one `error:` line on stderr and exit
code 2, never a traceback. Controls: the checks find a planted option without help and a
planted traceback."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from importlib import import_module, metadata
from pathlib import Path

import pytest

from processor.commands import main as cli


class _Captured(BaseException):
    """Raised by the patched parse_args with the parser a subcommand built (BaseException:
    the dispatcher's error policy must not swallow it)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The argparse parser `python -m processor <command>` parses its options with."""
    def capture(self: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        raise _Captured(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", capture)
        m.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        try:
            cli.main([command])
        except _Captured as got:
            return got.parser
    raise AssertionError(f"{command} parsed no arguments with argparse")


def options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                missing += [f"{sub.prog}: {o}" for o in options_without_help(sub)]
            continue
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append("/".join(action.option_strings) or action.dest)
    return missing


def commands() -> Iterator[str]:
    yield from cli._DELEGATED


@pytest.mark.parametrize("command", list(commands()))
def test_every_option_of_every_subcommand_has_help(command: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    parser = parser_of(command, monkeypatch)
    assert parser.prog == f"python -m processor {command}"
    assert options_without_help(parser) == []


def test_the_help_check_can_fail() -> None:
    """Control: an option without help (and one with blank help) is found."""
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--fine", help="documented")
    p.add_argument("--bare")
    p.add_argument("--blank", help="  ")
    assert options_without_help(p) == ["--bare", "--blank"]


def test_top_level_help_lists_every_command_and_version_is_the_package_version(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in cli._DELEGATED:
        assert f"\n  {command} " in out or out.rstrip().endswith(f"  {command}"), command
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.split() == ["dp-stream-counts",
                                               metadata.version("dp-stream-counts")]
    assert cli.main([]) == 2  # no command: the help on stderr, exit 2
    assert "commands:" in capsys.readouterr().err


def run(argv: Sequence[str]) -> int:
    try:
        return cli.main(list(argv))
    except SystemExit as exc:  # usage errors exit 2, like argparse's own
        return int(exc.code or 0)


def one_error_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def _bad_invocations(tmp: Path) -> dict[str, list[list[str]]]:
    missing = str(tmp / "missing.toml")
    commented_key = tmp / "commented.key"
    commented_key.write_text("00" * 32 + "  # not just hex\n")
    cfg_bad_key = tmp / "bad-key.toml"
    cfg_bad_key.write_text(f'allow_undeclared = true\nnoise_key_file = "{commented_key}"\n')
    cfg_broken = tmp / "broken.toml"
    cfg_broken.write_text("tick_ms = -5\n")
    unreachable = tmp / "unreachable.toml"
    key = tmp / "good.key"
    key.write_text("11" * 32 + "\n")
    unreachable.write_text(f'allow_undeclared = true\nbootstrap_servers = "127.0.0.1:9"\n'
                           f'noise_key_file = "{key}"\n')
    ticks = tmp / "ticks"
    ticks.write_text("1\nnot-a-tick\n")
    count = ["count", "--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6"]
    return {
        "count": [["count"], [*count[:3], "--epsilon", "abc", "--delta", "1e-6", "--seed", "1"],
                  ["count", "--mechanism", "nope", "--epsilon", "1", "--delta", "1e-6",
                   "--seed", "1"],
                  [*count, "--key-file", str(commented_key)],
                  [*count[:3], "--epsilon", "-1", "--delta", "1e-6", "--seed", "1"],
                  [*count, "--seed", "1", "--input", str(ticks)],
                  [*count, "--seed", "1", "--input", str(tmp / "no-such-file")]],
        "keygen": [["keygen"], ["keygen", str(key / "under-a-file" / "k")],
                   ["keygen", str(key)], ["keygen", "--bogus", str(tmp / "k2")]],
        "worker": [["worker", "--config", missing], ["worker", "--bogus"],
                   ["worker", "--key-format", "base64"],
                   ["worker", "--config", str(cfg_bad_key)],
                   ["worker", "--config", str(cfg_broken)]],
        "replay": [["replay", "--config", missing], ["replay", "--timeout", "abc"],
                   ["replay", "--config", str(cfg_bad_key)],
                   ["replay", "--config", str(cfg_broken)],
                   ["replay", "--config", str(unreachable), "--timeout", "2", "--quiet"]],
        "send": [["send", "--config", missing], ["send", "--timeout", "abc"],
                 ["send", "--config", str(cfg_broken)],
                 ["send", "--config", str(unreachable), str(tmp / "no-such-file")]],
        "demo": [["demo", "--bogus"], ["demo", "--seconds", "abc"]],
        "experiment": [["experiment"], ["experiment", "fig9"],
                       ["experiment", "fig1a", "--runs", "abc"]],
        "audit": [["audit"], ["audit", "--mechanism", "ecc", "--epsilon", "abc",
                              "--delta", "1e-6"],
                  ["audit", "--mechanism", "nope", "--epsilon", "1", "--delta", "1e-6"],
                  ["audit", "--mechanism", "ecc", "--epsilon", "-1", "--delta", "1e-6"]],
        "view": [["view", "--bogus"], ["view", "--port", "abc"],
                 ["view", "--config", missing], ["view", "--config", str(cfg_broken)]],
        "plan": [["plan"], ["plan", "--epsilon", "abc", "--delta", "1e-6", "--tick-ms", "100",
                            "--rate", "1"],
                 ["plan", "--epsilon", "-1", "--delta", "1e-6", "--tick-ms", "100",
                  "--rate", "1"]],
        "": [["no-such-command"]],
    }


def test_bad_invocations_are_one_error_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Several bad invocations per subcommand (usage errors, unreadable or invalid
    configuration, a bad key file, bad values, an unreachable broker): exit 2, exactly one
    `error:` line on stderr, no traceback."""
    for var in ("DPC_NOISE_KEY_FILE", "DPC_NOISE_KEY_FORMAT", "DPC_BOOTSTRAP_SERVERS",
                "KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(var, raising=False)
    failures = []
    cases = _bad_invocations(tmp_path)
    assert set(cases) - {""} == set(cli._DELEGATED)  # a new command brings its cases
    for argv in (a for group in cases.values() for a in group):
        capsys.readouterr()
        code = run(argv)
        _out, err = capsys.readouterr()
        if code != 2 or not one_error_line(err):
            failures.append(f"{argv}: exit {code}, stderr {err!r}")
    assert failures == []


def test_the_error_policy_turns_any_exception_into_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A typed error keeps its message under its prefix; an unexpected one is named by its
    type; Ctrl-C is exit 130. Control: the line check rejects a traceback."""
    from processor.commands import keygen
    from processor.core.errors import NoiseKeyError
    from processor.stream.model.config import ConfigError

    def raising(exc: BaseException) -> None:
        def entry(argv: list[str]) -> int:
            raise exc
        monkeypatch.setattr(keygen, "main_keygen", entry)

    for exc, line in ((ConfigError("tick_ms", "must be >= 1"),
                       "error: configuration: tick_ms: must be >= 1"),
                      (NoiseKeyError("bad key"), "error: noise key: bad key"),
                      (ZeroDivisionError("oops\nsecond line"),
                       "error: ZeroDivisionError: oops second line")):
        raising(exc)
        assert cli.main(["keygen"]) == 2
        assert capsys.readouterr().err == line + "\n"
    raising(KeyboardInterrupt())
    assert cli.main(["keygen"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    # No command patches argparse: each builds a CommandParser.
    assert argparse.ArgumentParser.error is argparse.ArgumentParser.__dict__["error"]
    assert not one_error_line("Traceback (most recent call last):\nerror: x\n")
    assert not one_error_line("error: a\nerror: b\n")


def test_the_real_entry_points(tmp_path: Path) -> None:
    """`python -m processor` as a process: --version, `experiment --help` names the
    dispatcher, a bad invocation is one line with exit 2 (the `dpcount` script is the same
    `processor.commands.main:main`)."""
    def proc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "processor", *args], text=True,
                              capture_output=True, timeout=120, cwd=tmp_path)

    done = proc("--version")
    assert done.returncode == 0 and done.stdout.strip().startswith("dp-stream-counts ")
    done = proc("experiment", "--help")
    assert done.returncode == 0 and done.stdout.startswith(
        "usage: python -m processor experiment"), done.stdout
    done = proc("replay", "--config", str(tmp_path / "none.toml"))
    assert done.returncode == 2 and one_error_line(done.stderr), done.stderr
    # An unreachable broker: librdkafka's own lines never reach stderr, one line names it.
    key = tmp_path / "k.key"
    key.write_text("22" * 32 + "\n")
    key.chmod(0o600)
    cfg = tmp_path / "unreachable.toml"
    cfg.write_text(f'allow_undeclared = true\nbootstrap_servers = "127.0.0.1:9"\n'
                   f'noise_key_file = "{key}"\n')
    done = proc("replay", "--config", str(cfg), "--timeout", "2")
    assert done.returncode == 2 and one_error_line(done.stderr), done.stderr
    assert "127.0.0.1:9" in done.stderr
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = pyproject["project"]["scripts"]["dpcount"]
    module, _, name = declared.partition(":")
    assert getattr(import_module(module), name) is cli.main
    scripts = metadata.distribution("dp-stream-counts").entry_points
    installed = {e.value for e in scripts if e.name == "dpcount"}
    if installed != {declared}:
        pytest.skip(f"the installed dpcount script runs {installed}, pyproject.toml declares "
                    f"{declared!r}: reinstall the package (deploy/setup.sh)")


@pytest.mark.parametrize("command", list(commands()))
def test_cached_help_is_the_parsers_help(command: str) -> None:
    """processor/_help.py (what `<command> --help` prints without importing the command)
    equals the parser's own help at 80 columns; `python deploy/update_help.py` refreshes
    it. Control: a stale cache is caught by the same comparison (below)."""
    from processor._help import HELP

    assert HELP[command] == cli.render_help(command), (
        "stale processor/_help.py: run python deploy/update_help.py")


def test_help_is_fast_and_abbreviations_are_refused(tmp_path: Path) -> None:
    """`worker --help` without importing Faust/scipy: well under a second (measured 0.96 s
    before the cache, ~0.07 s after; the bound leaves room for a loaded machine). `--conf`
    is not taken for `--config` (argparse's prefix matching is off for every command)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    best = min(_timed([sys.executable, "-m", "processor", "worker", "--help"], env)
               for _ in range(3))
    assert best < 0.6, best
    for argv in (["worker", "--conf", "x"], ["plan", "--eps", "1", "--delta", "1e-6",
                                             "--tick-ms", "100", "--rate", "1"],
                 ["replay", "--conf", "x"], ["view", "--conf", "x"]):
        done = subprocess.run([sys.executable, "-m", "processor", *argv], env=env, text=True,
                              capture_output=True, timeout=60)
        # Refused: as an unknown option, or (plan) --epsilon stays missing.
        assert done.returncode == 2 and ("unrecognized arguments" in done.stderr
                                         or "required: --epsilon" in done.stderr), (
            argv, done.stderr)
    # Control: the full option name is accepted by the same parser (plan runs).
    done = subprocess.run([sys.executable, "-m", "processor", "plan", "--epsilon", "5",
                           "--delta", "1e-6", "--tick-ms", "100", "--rate", "1", "--json"],
                          env=env, text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _timed(argv: list[str], env: dict[str, str]) -> float:
    import time

    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0
    return time.perf_counter() - t0


def test_usage_names_dpcount_when_invoked_as_dpcount(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run as the `dpcount` script (sys.argv[0]), usage and errors say `dpcount`, from the
    cache and from a live parser alike; as `python -m processor`, they say that (control)."""
    monkeypatch.setattr(sys, "argv", ["/x/bin/dpcount", "worker", "--help"])
    assert cli.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dpcount worker [-h] [--config CONFIG]"), out
    second = out.splitlines()[1]
    assert second.startswith(" " * len("usage: dpcount worker ") + "["), second
    monkeypatch.setattr(sys, "argv", ["/x/bin/dpcount", "plan", "--bogus"])
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err.startswith("error: dpcount plan: ")
    monkeypatch.setattr(sys, "argv", ["/x/processor/__main__.py", "plan", "--bogus"])
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err.startswith("error: python -m processor plan: ")


def test_stale_help_cache_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for test_cached_help_is_the_parsers_help: a changed option shows."""
    from processor._help import HELP
    from processor.commands import count

    original = count.count_parser

    def with_extra_option() -> argparse.ArgumentParser:
        p = original()
        p.add_argument("--new-option", help="added after the cache was written")
        return p

    monkeypatch.setattr(count, "count_parser", with_extra_option)
    assert "--new-option" in cli.render_help("count")
    assert HELP["count"] != cli.render_help("count")


def test_audit_and_library_errors_have_their_lines() -> None:
    """The audit's AuditError is a ProcessorError with its prefix; librdkafka's
    KafkaException, not ours, is matched by isinstance once a command loaded the client.
    Control: an exception of neither is named by its type."""
    from confluent_kafka import KafkaException

    from processor.audit.statistics import AuditError
    from processor.errors import ProcessorError

    assert issubclass(AuditError, ProcessorError)
    assert cli.error_line(AuditError("constant score")) == "error: audit: constant score"
    assert cli.error_line(KafkaException("all brokers down")) == (
        "error: Kafka: all brokers down")
    assert cli.error_line(LookupError("x")) == "error: LookupError: x"


def test_the_hierarchy_carries_the_prefixes() -> None:
    """Core errors are ProcessorErrors with their line prefixes; the stream and refused
    families exist; a CommandParser outside the dispatcher is plain argparse (exit 2)."""
    from processor.commandline import CommandParser
    from processor.core.errors import CoreError, NoiseKeyError, StateFormatError
    from processor.errors import ProcessorError, RefusedError, StreamError, UsageError
    from processor.stream.kafka.kafka_io import BrokerUnavailable

    assert issubclass(CoreError, ProcessorError) and issubclass(BrokerUnavailable, StreamError)
    assert issubclass(RefusedError, StreamError) and issubclass(RefusedError, RuntimeError)
    assert cli.error_line(NoiseKeyError("k")) == "error: noise key: k"
    assert cli.error_line(StateFormatError("s")) == "error: state: s"
    assert cli.error_line(UsageError("p", "m")) == "error: p: m (see p --help)"
    with pytest.raises(SystemExit):
        CommandParser(prog="x").parse_args(["--bogus"])


def test_sigterm_before_the_worker_runs_unwinds_and_exits_143(tmp_path: Path) -> None:
    """A worker stopped (SIGTERM: a rollout, `docker stop`) before Faust installs its own
    handlers, here while it waits for brokers that do not answer: it unwinds, prints one
    line and exits 143, not killed by the signal (-15) midway through its start. The
    worker is caught in that wait: its first librdkafka thread exists and the wait
    lasts BROKER_PROBE_S (5 s)."""
    import contextlib
    import signal
    import socket
    import time

    from processor.devtools.deployment import isolated_deployment

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dep = isolated_deployment(f"127.0.0.1:{port}", {"c": 0}, parent=tmp_path,
                              create_topics=False)
    proc = subprocess.Popen([sys.executable, "-m", "processor", "worker", "--config",
                             str(dep.config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def in_librdkafka() -> bool:
            names = []
            for comm in Path(f"/proc/{proc.pid}/task").glob("*/comm"):
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    names.append(comm.read_text())
            return any(n.startswith("rdk:") for n in names)

        deadline = time.monotonic() + 60
        while not in_librdkafka():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["", *commands()])
def test_help_into_a_reader_that_leaves_is_quiet(command: str, tmp_path: Path) -> None:
    """`python -m processor [<command>] --help | head -1`: the first line, exit 0 and
    nothing on stderr, for the top level and every command; and, deterministically, the
    same when the reader has closed the pipe before a byte is written (the write fails
    with EPIPE: no BrokenPipeError traceback, exit 0). Control: a Python that prints into
    the closed pipe without the dispatcher's handling does print the traceback."""
    argv = [sys.executable, "-m", "processor", *([command] if command else []), "--help"]
    shell = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -1', "_", *argv],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.startswith("usage: python -m processor") and shell.stderr == ""

    code, err = _into_closed_pipe(argv, tmp_path)
    assert (code, err) == (0, "")
    code, err = _into_closed_pipe([sys.executable, "-c", "print('usage: x')"], tmp_path)
    assert code != 0 and "BrokenPipeError" in err  # control


def _into_closed_pipe(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run `args` with standard output a pipe whose reader left before the writer
    started: (exit code, stderr)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120, cwd=cwd)
    finally:
        os.close(write)
    return done.returncode, done.stderr


def a_socket_broke(_args: list[str]) -> int:
    """A command entry (for the dispatcher's table) whose connection broke."""
    raise BrokenPipeError(32, "Broken pipe")


def test_a_command_whose_reader_leaves_is_quiet_and_another_broken_pipe_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A command's own output into a pipe whose reader has left (`count ... | head -c 600`:
    more than a pipe buffer, so the command's write fails, not the final flush): exit 0 and
    nothing on stderr. Control: a BrokenPipeError while standard output is fine (a socket
    broke) is an error, one `error:` line and exit 2."""
    ticks = tmp_path / "ticks.txt"
    ticks.write_text("_\n" * 20_000)
    argv = [sys.executable, "-m", "processor", "count", "--mechanism", "simecc",
            "--epsilon", "1", "--delta", "1e-6", "--seed", "7", "--input", str(ticks)]
    assert _into_closed_pipe(argv, tmp_path) == (0, "")

    monkeypatch.setitem(cli._DELEGATED, "broken", (__name__, "a_socket_broke"))
    assert cli.main(["broken"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def _sigterm_disposition(_: int) -> str:
    handler = signal.getsignal(signal.SIGTERM)
    if handler is None:  # set outside Python
        return "None"
    return handler.__name__ if callable(handler) else signal.Handlers(handler).name


def test_forked_pool_workers_do_not_inherit_the_terminated_handler() -> None:
    """A pool forked while the dispatcher's SIGTERM handler is on (replay's recomputation,
    the experiments' figures) gets SIGTERM's default back from `pool_worker_signals`, so
    Pool.terminate() at the end prints no Terminated traceback per process. Control:
    without the initializer the fork has the dispatcher's handler (the traceback's cause:
    issue 31 saw it in 4 of 12 replays)."""
    import multiprocessing

    from processor.commandline import pool_worker_signals

    ctx = multiprocessing.get_context("fork")
    with cli._sigterm_unwinds():
        with ctx.Pool(1, initializer=pool_worker_signals) as pool:
            assert pool.map(_sigterm_disposition, [0]) == ["SIG_DFL"]
        with ctx.Pool(1) as pool:
            assert pool.map(_sigterm_disposition, [0]) == ["_terminated"]


@pytest.mark.parametrize("command", list(commands()))
def test_epsilon_is_spelled_epsilon_everywhere(command: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every option of every command that takes an epsilon is `--epsilon` (or a
    `--unit-epsilon`); `--eps` survives only as a second name of `experiment --epsilon`.
    Control: a parser with a lone `--eps` is caught by the same check."""
    def lone_eps(parser: argparse.ArgumentParser) -> list[str]:
        bad = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    bad += lone_eps(sub)
            names = set(action.option_strings)
            if any("eps" in n and "epsilon" not in n for n in names) and not (
                    names & {"--epsilon"}):
                bad.append("/".join(sorted(names)))
        return bad

    assert lone_eps(parser_of(command, monkeypatch)) == []
    control = argparse.ArgumentParser()
    control.add_argument("--eps")
    assert lone_eps(control) == ["--eps"]
