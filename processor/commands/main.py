"""Command line: `python -m processor <command> [options]` (alias: the `dpcount` script).

One dispatcher: `_DELEGATED` maps each subcommand to where it lives (adding a command is one
line there); every subcommand parses its own options (`--help` on each) with a
processor.commandline.CommandParser. One error policy (`main`, `error_line`): a usage error
or a typed error (processor.errors' hierarchy: configuration, noise key, core, state
format, broker, audit, ...) is ONE `error: ...` line on stderr and exit code 2, never a
traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib import import_module, metadata
from pathlib import Path
from typing import NoReturn

from processor import errors
from processor.commandline import PROG, dispatching
from processor.errors import EXIT_ERROR, ProcessorError, UsageError, print_error

# Nothing heavy at import: `python -m processor <command> --help` and `keygen` must start
# in a fraction of a second (numpy, scipy, Faust and aiohttp are imported by the commands
# that need them; the help texts of the heavy commands come from processor/_help.py).

# Every subcommand: name -> (module, entry function[, one-line summary]). The entry takes
# the argument list after the command name and returns the exit code. Modules are imported
# only when their command runs, so `count` stays light. Adding a command is one line.
_DELEGATED: dict[str, tuple[str, str] | tuple[str, str, str]] = {
    "count": ("processor.commands.count", "main_count",
              "run a mechanism offline over a file of ticks (one JSON line per tick)"),
    "keygen": ("processor.commands.keygen", "main_keygen", "write a fresh random noise key file"),
    "worker": ("processor.stream.worker.app", "main_worker", "run the stream processor"),
    "send": ("processor.commands.send", "main_send",
             "send events to the input topic (JSON lines or counter[,ts[,value[,user]]])"),
    "replay": ("processor.stream.replay", "main_replay",
               "audit: recompute the published topics from the timeline and compare"),
    "demo": ("processor.devtools.demo", "main_demo",
             "local broker + processor + bursty demo producer, private counts printed"),
    "view": ("processor.view.server", "main_view", "live web page of the public topics"),
    "experiment": ("processor.experiments.cli", "main_experiment",
                   "the paper's Section 8 experiments (figures and table)"),
    "audit": ("processor.commands.audit", "main_audit",
              "empirical privacy audit of a mechanism on edit-neighbouring streams"),
    "plan": ("processor.commands.plan", "main_plan",
             "expected error and update times before deploying"),
}


def _library_errors() -> tuple[tuple[type[BaseException], str], ...]:
    """Errors of the libraries the commands use and the prefix of their line. A library
    that is not loaded raised nothing, and importing it only to check would cost `count`
    and `keygen` librdkafka's load."""
    if "confluent_kafka" not in sys.modules:
        return ()
    from confluent_kafka import KafkaException

    return ((KafkaException, "Kafka: "),)


def error_line(exc: BaseException) -> str:
    """The one `error: ...` line of an exception (the dispatcher's error policy,
    processor.errors.error_line, with librdkafka's errors under `Kafka: `). Never a
    traceback, never a secret (no message of the project includes key bytes or raw
    input)."""
    return errors.error_line(exc, _library_errors())


def _version() -> str:
    try:
        return metadata.version("dp-stream-counts")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        from processor import __version__
        return __version__


def _help(prog: str = PROG) -> str:
    width = max(len(c) for c in _DELEGATED)
    lines = [f"  {name:<{width}}  {entry[2] if len(entry) > 2 else ''}".rstrip()
             for name, entry in _DELEGATED.items()]
    return (f"usage: {prog} [--version] <command> [options]\n\n"
            "Differentially private running counts on Kafka.\n\ncommands:\n"
            + "\n".join(lines)
            + f"\n\n`{prog} <command> --help` lists a command's options.\n"
            "Exit codes: 0 success; 1 a negative verdict (replay: different, audit: "
            "failed);\n2 an error (one `error:` line on stderr); 3 replay: different under "
            "a configuration\nor key the ledger contradicts (named in its first line).")


def invoked_as(argv0: str) -> str:
    """The command prefix for usage lines: `dpcount` when the script of that name runs."""
    return "dpcount" if Path(argv0).name == "dpcount" else PROG


def _renamed(text: str, prog: str) -> str:
    """A help text rendered under PROG, renamed to `prog`: the usage line's continuation
    lines are aligned under its options, so they move by the difference in length."""
    if prog == PROG:
        return text
    shift = len(PROG) - len(prog)
    lines = text.split("\n")
    in_usage = True
    for i, line in enumerate(lines):
        if i == 0:
            lines[0] = line.replace(PROG, prog, 1)
        elif in_usage and line.startswith(" " * shift) and line.strip():
            lines[i] = line[shift:]
        else:
            in_usage = False
    return "\n".join(lines).replace(f"{PROG} ", f"{prog} ")


def render_help(command: str, columns: int = 80) -> str:
    """`python -m processor <command> --help` as the command itself prints it, at a fixed
    width (what processor/_help.py caches; its test compares the two)."""
    entry = _DELEGATED[command]
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)  # argparse's width comes from the terminal size
    try:
        # --help exits 0 after printing: suppressed.
        with (contextlib.redirect_stdout(out), dispatching(PROG),
              contextlib.suppress(SystemExit)):
            getattr(import_module(entry[0]), entry[1])(["--help"])
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue()


def write_help_module(path: Path | None = None) -> Path:
    """Regenerate processor/_help.py from the commands' own parsers
    (`python deploy/update_help.py`; tests/test_cli.py fails while it is stale)."""
    target = path or Path(__file__).parents[1] / "_help.py"
    body = "".join(f"    {name!r}: {render_help(name)!r},\n" for name in _DELEGATED)
    target.write_text(
        "# ruff: noqa: E501\n"
        '"""GENERATED by `python deploy/update_help.py`\n'
        "(processor.commands.main.write_help_module): the `--help` text of every command at 80\n"
        "columns, so `python -m processor <command> --help` prints it without importing the\n"
        "command's module (Faust, scipy, aiohttp take about a second). tests/test_cli.py fails\n"
        'when a text differs from the parser\'s."""\n\n'
        "HELP: dict[str, str] = {\n" + body + "}\n", encoding="utf-8")
    return target


def _cached_help(command: str, prog: str) -> str | None:
    try:
        from processor._help import HELP
    except ImportError:  # not generated (a partial checkout): the live parser answers
        return None
    text = HELP.get(command)
    return None if text is None else _renamed(text, prog)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while no handler of the command's own was installed (a worker
    before Faust installs its handlers: imports, topic checks, reading the ledger).
    A KeyboardInterrupt, so that no `except Exception` swallows it, and the command
    unwinds its `finally` blocks as at Ctrl-C."""


def _terminated(signum: int, frame: object) -> NoReturn:
    raise Terminated


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread while the block runs; the previous
    handler is back afterwards (a test calling main() keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stdout_to_devnull() -> None:
    """The reader of standard output left (`... --help | head -1`): what is still buffered
    goes to /dev/null, so the interpreter's flush at exit raises no BrokenPipeError (and
    prints no traceback of it)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is no file (a test's capture): nothing is flushed to a pipe at exit
    finally:
        os.close(devnull)


def _stdout_reader_left() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll reports POLLERR
    on the write end of such a pipe): a command's BrokenPipeError is then the reader
    leaving, not a failure of the command."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (OSError, ValueError, io.UnsupportedOperation):
        return False  # stdout is no file (a test's capture)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch `argv` (default: sys.argv[1:]) to its subcommand under one error policy:
    a usage error or any exception is one `error:` line on stderr and exit code 2 (usage
    errors raise SystemExit(2), as argparse does); Ctrl-C exits 130 and SIGTERM 143
    (unless the command handles it itself, as the worker does once Faust runs), both
    without a traceback. A reader of standard output that leaves early (a pipe into
    `head`) ends the output quietly: exit 0, no BrokenPipeError."""
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return 0
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = invoked_as(sys.argv[0]) if argv is None else PROG
    if not args or args[0] in ("-h", "--help"):
        print(_help(prog), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"dp-stream-counts {_version()}")
        return 0
    cmd, rest = args[0], args[1:]
    entry = _DELEGATED.get(cmd)
    if entry is None:
        print_error(f"unknown command {cmd!r} (commands: {', '.join(_DELEGATED)}; "
                    f"see {prog} --help)")
        return 2
    if rest in (["--help"], ["-h"]):
        cached = _cached_help(cmd, prog)
        if cached is not None:
            sys.stdout.write(cached)
            return 0
    try:
        with dispatching(prog), _sigterm_unwinds():
            func: Callable[[list[str]], int | None] = getattr(import_module(entry[0]),
                                                              entry[1])
            return int(func(rest) or 0)
    except UsageError as exc:
        print_error(exc, foreign=_library_errors())
        raise SystemExit(2) from None
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if _stdout_reader_left():  # `... | head`: main ends the output quietly
            raise
        print_error(exc, foreign=_library_errors())  # another pipe (a socket) broke
        return EXIT_ERROR
    except Exception as exc:
        print_error(exc, foreign=_library_errors())
        return exc.exit_code if isinstance(exc, ProcessorError) else EXIT_ERROR
