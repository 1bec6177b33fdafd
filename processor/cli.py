"""Command line: `python -m processor <command> [options]` (alias: the `dpcount` script).

One dispatcher: `_DELEGATED` maps each subcommand to where it lives (adding a command is one
line there); every subcommand parses its own options (`--help` on each) with a
processor.commandline.CommandParser. One error policy (`main`, `error_line`): a usage error
or a typed error (processor.errors' hierarchy: configuration, noise key, core, state
format, broker, ...) is ONE `error: ...` line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib import import_module, metadata
from pathlib import Path
from typing import NoReturn, TextIO

from processor.commandline import PROG, CommandParser, dispatching
from processor.errors import EXIT_ERROR, ProcessorError, UsageError

# Nothing heavy at import: `python -m processor <command> --help` and `keygen` must start
# in a fraction of a second (numpy, scipy, Faust and aiohttp are imported by the commands
# that need them; the help texts of the heavy commands come from processor/_help.py).

# Every subcommand: name -> (module, entry function[, one-line summary]). The entry takes
# the argument list after the command name and returns the exit code. Modules are imported
# only when their command runs, so `count` stays light. Adding a command is one line.
_DELEGATED: dict[str, tuple[str, str] | tuple[str, str, str]] = {
    "count": ("processor.cli", "main_count",
              "run a mechanism offline over a file of ticks (one JSON line per tick)"),
    "keygen": ("processor.cli", "main_keygen", "write a fresh random noise key file"),
    "worker": ("processor.stream.app", "main_worker", "run the stream processor"),
    "replay": ("processor.stream.replay", "main_replay",
               "audit: recompute the published topics from the timeline and compare"),
    "demo": ("processor.devtools.demo", "main_demo",
             "local broker + processor + bursty demo producer, private counts printed"),
    "view": ("processor.view.server", "main_view", "live web page of the public topics"),
    "experiment": ("processor.experiments.cli", "main_experiment",
                   "the paper's Section 8 experiments (figures and table)"),
    "audit": ("processor.audit_cli", "main_audit",
              "empirical privacy audit of a mechanism on edit-neighbouring streams"),
    "plan": ("processor.plan", "main_plan", "expected error and update times before deploying"),
}


def _count_parser() -> argparse.ArgumentParser:
    from processor.core import registry
    from processor.core.rng import KEY_FORMATS
    from processor.core.tight import CALIBRATIONS

    p = CommandParser(
        prog="python -m processor count", allow_abbrev=False,
        description="Run a private counter over ticks read one per line: a number in [0, 1], "
        "_ for a tick with no event, _*N for N such ticks. Writes {\"t\": t, \"y\": y} per tick.",
    )
    p.add_argument("--mechanism", required=True, choices=registry.names(),
                   help="the registered mechanism to run")
    p.add_argument("--epsilon", type=float, required=True, help="privacy parameter epsilon")
    p.add_argument("--delta", type=float, required=True, help="privacy parameter delta")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--key-file", help="the secret noise key (production generator)")
    src.add_argument("--seed", type=int, help="a public, reproducible key (tests, experiments)")
    p.add_argument("--key-format", choices=KEY_FORMATS, default="hex",
                   help="how --key-file is read: hex (default, what keygen writes) or raw")
    p.add_argument("--input", help="tick file (default: standard input)")
    p.add_argument("--changes", action="store_true",
                   help="print only the ticks where y changes, plus the last tick")
    p.add_argument("--counter-id", default="offline",
                   help="the counter identity the noise stream is keyed by (default: offline)")
    p.add_argument("--horizon", type=int, help="stream length T (partitioncc needs it)")
    p.add_argument("--base", choices=("tree", "sqrt"), help="basecc's bounded counter")
    p.add_argument("--calibration", choices=CALIBRATIONS,
                   help="ecc/simecc: the paper's constants (default) or the tight analysis "
                        "(docs/tight-calibration.md)")
    p.add_argument("--with-bound", action="store_true",
                   help="add \"bound\": |y_t - s_t| <= bound with probability >= 1 - beta "
                        "at that tick (public: parameters and t only)")
    p.add_argument("--beta", type=float, default=0.05, help="failure probability of --with-bound")
    return p


def cmd_count(argv: Sequence[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    args = _count_parser().parse_args(argv)
    import orjson

    from processor.core import registry
    from processor.core.errors import CoreError
    from processor.core.rng import NoiseKey
    from processor.keyfile import read_key
    from processor.offline import TickSyntaxError, parse_ticks, run_counter

    try:
        key = (read_key(args.key_file, args.key_format) if args.key_file
               else NoiseKey.from_seed(args.seed))
        params: dict[str, object] = {}
        if args.horizon is not None:
            params["horizon"] = args.horizon
        if args.base is not None:
            params["base"] = args.base
        if args.calibration is not None:
            params["calibration"] = args.calibration
        counter = registry.make(args.mechanism, args.epsilon, args.delta, key, args.counter_id,
                                **params)
        if args.with_bound:
            counter.error_bound(args.beta)  # the mechanism's own check of beta, up front
    except (CoreError, TypeError) as exc:
        print(f"error: {exc}", file=stderr)
        return 2
    try:
        source = open(args.input, encoding="utf-8") if args.input else stdin  # noqa: SIM115
    except OSError as exc:
        print(f"error: cannot read {args.input!r}: {exc.strerror}", file=stderr)
        return 2
    try:
        out = []
        for t, y in run_counter(counter, parse_ticks(source), changes_only=args.changes):
            row: dict[str, float] = {"t": t, "y": y}
            if args.with_bound:
                row["bound"] = counter.error_bound_at(t, args.beta)
            out.append(orjson.dumps(row))
            if len(out) >= 4096:
                stdout.write(b"\n".join(out).decode() + "\n")
                out.clear()
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
    except TickSyntaxError as exc:
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
        print(f"error: {exc}", file=stderr)
        return 2
    finally:
        if source is not stdin:
            source.close()
    return 0


def cmd_keygen(argv: Sequence[str], stdout: TextIO, stderr: TextIO) -> int:
    p = CommandParser(prog="python -m processor keygen", allow_abbrev=False,
                      description="Write a fresh 256-bit noise key as hex (mode 0600). "
                      "Missing directories of the path are created with mode 0700.")
    p.add_argument("path", help="the key file to write (mode 0600; e.g. secrets/noise.key, "
                   "a directory the repository's .gitignore excludes)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = p.parse_args(argv)
    from processor.keyfile import make_private_dirs, write_key

    try:
        # The README's `keygen secrets/noise.key` on a fresh clone: the directory is
        # created, private to its owner like the key inside it.
        make_private_dirs(Path(args.path).parent)
        write_key(args.path, overwrite=args.force)
    except FileExistsError:
        print(f"error: {args.path!r} exists (use --force to overwrite)", file=stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.path!r}: {exc.strerror}", file=stderr)
        return 2
    print(f"wrote a new noise key to {args.path}", file=stdout)
    return 0


def main_count(argv: Sequence[str]) -> int:
    return cmd_count(argv, sys.stdin, sys.stdout, sys.stderr)


def main_keygen(argv: Sequence[str]) -> int:
    return cmd_keygen(argv, sys.stdout, sys.stderr)


def _foreign_errors() -> list[tuple[type[BaseException], str]]:
    """Typed errors outside processor.errors' hierarchy and the prefix of their line, most
    specific first. A class whose module is not loaded has no instance to match, so each
    is looked up in sys.modules: nothing is imported to check (`count` and `keygen` stay
    light). tests/test_cli.py checks that every (module, class) here names a class."""
    out: list[tuple[type[BaseException], str]] = []
    for module, name, prefix in _PENDING_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            out.append((cls, prefix))
    out += [(TimeoutError, "timed out: "), (OSError, "")]
    return out


#: Typed errors that are not ProcessorErrors yet: (module, class, prefix of its line). The
#: first four live in modules edited elsewhere at the time of writing; each leaves this
#: table when its class subclasses a family of processor.errors with `error_prefix` set.
#: librdkafka's KafkaException is not ours and stays.
_PENDING_ERRORS: tuple[tuple[str, str, str], ...] = (
    ("processor.core.audit", "AuditError", "audit: "),
    ("confluent_kafka", "KafkaException", "Kafka: "),
)


def error_line(exc: BaseException) -> str:
    """The one `error: ...` line of an exception (the dispatcher's error policy): a
    ProcessorError under its `error_prefix`, another typed error under its prefix, any
    other exception named by its type. Never a traceback, never a secret (no message of
    the project includes key bytes or raw input)."""
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    if isinstance(exc, UsageError):
        return f"error: {exc}"
    if isinstance(exc, ProcessorError):
        return f"error: {exc.error_prefix}{text}"
    for cls, prefix in _foreign_errors():
        if isinstance(exc, cls):
            return f"error: {prefix}{text}"
    return f"error: {type(exc).__name__}: {text}"


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
            "failed);\n2 an error (one `error:` line on stderr).")


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
    import io

    entry = _DELEGATED[command]
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)  # argparse's width comes from the terminal size
    try:
        # --help exits 0 after printing: suppressed.
        with (contextlib.redirect_stdout(out), _dispatch(command, PROG),
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
    target = path or Path(__file__).with_name("_help.py")
    body = "".join(f"    {name!r}: {render_help(name)!r},\n" for name in _DELEGATED)
    target.write_text(
        "# ruff: noqa: E501\n"
        '"""GENERATED by `python deploy/update_help.py` (processor.cli.write_help_module):\n'
        "the `--help` text of every command at 80 columns, so `python -m processor <command>\n"
        "--help` prints it without importing the command's module (Faust, scipy, aiohttp take\n"
        'about a second). tests/test_cli.py fails when a text differs from the parser\'s."""\n\n'
        "HELP: dict[str, str] = {\n" + body + "}\n", encoding="utf-8")
    return target


def _cached_help(command: str, prog: str) -> str | None:
    try:
        from processor._help import HELP
    except ImportError:  # not generated (a partial checkout): the live parser answers
        return None
    text = HELP.get(command)
    return None if text is None else _renamed(text, prog)


#: Commands whose module (edited elsewhere at the time of writing) still builds a plain
#: argparse.ArgumentParser. Only while one of them runs does the dispatcher patch argparse
#: so that their parsers behave as CommandParsers; a command leaves this set when its
#: module builds a CommandParser, and the patch goes with the last one.
_PLAIN_PARSERS = frozenset({"worker", "audit", "plan"})


def _raise_usage(self: argparse.ArgumentParser, message: str) -> NoReturn:
    raise UsageError(self.prog, message)


@contextlib.contextmanager
def _dispatch(command: str, prog: str) -> Iterator[None]:
    """The dispatcher's parser policy (processor.commandline) while `command` runs."""
    with dispatching(prog):
        if command not in _PLAIN_PARSERS:
            yield
            return
        error, init = argparse.ArgumentParser.error, argparse.ArgumentParser.__init__

        def patched_init(parser: argparse.ArgumentParser, *args: object,
                         **kwargs: object) -> None:
            kwargs["allow_abbrev"] = False
            init(parser, *args, **kwargs)  # type: ignore[arg-type]
            if prog != PROG and parser.prog.startswith(PROG):
                parser.prog = prog + parser.prog[len(PROG):]

        argparse.ArgumentParser.error = _raise_usage  # type: ignore[method-assign]
        argparse.ArgumentParser.__init__ = patched_init  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            argparse.ArgumentParser.error = error  # type: ignore[method-assign]
            argparse.ArgumentParser.__init__ = init  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch `argv` (default: sys.argv[1:]) to its subcommand under one error policy:
    a usage error or any exception is one `error:` line on stderr and exit code 2 (usage
    errors raise SystemExit(2), as argparse does); Ctrl-C exits 130 without a traceback."""
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
        print(f"error: unknown command {cmd!r} (commands: {', '.join(_DELEGATED)}; "
              f"see {prog} --help)", file=sys.stderr)
        return 2
    if rest in (["--help"], ["-h"]):
        cached = _cached_help(cmd, prog)
        if cached is not None:
            sys.stdout.write(cached)
            return 0
    try:
        with _dispatch(cmd, prog):
            func: Callable[[list[str]], int | None] = getattr(import_module(entry[0]),
                                                              entry[1])
            return int(func(rest) or 0)
    except UsageError as exc:
        print(error_line(exc), file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(error_line(exc), file=sys.stderr)
        return exc.exit_code if isinstance(exc, ProcessorError) else EXIT_ERROR
