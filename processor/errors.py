"""The one error hierarchy of the project: a root, a branch per layer, a "refused" family.

```
ProcessorError                       root: every error raised on purpose
├── processor.core.errors.CoreError  the privacy core (input, parameter, state, noise key)
├── StreamError                      the stream layer (worker, ingest, replay, brokers):
│   │                                its start, storage, timeline, broker, delivery,
│   │                                ingest, metrics and replay errors
│   └── RefusedError                 the worker refuses to go on with stored state: an
│                                    announced counter whose state is gone, a noise key
│                                    that differs from the state's, a parameter change
├── ConfigError                      the configuration: a missing, mistyped or
│   (processor.stream.model.config) out-of-domain value
├── UsageError                       a command line the parser refused
├── AuditError (processor.audit)     the audit cannot run or cannot conclude
├── TickSyntaxError                  a malformed tick file of `count`
│   (processor.commands.offline)
└── LocalKafkaError, ProxyError      the development tooling's local broker and proxy
    (processor.devtools)
```

Outside it on purpose: faults.InjectedFault (it stands for a bug, so nothing may treat it
as an error raised on purpose) and transaction.TransactionStatusError (a caller's
programming error, like an assertion).

Each class carries the prefix of its one `error:` line (`error_prefix`) and the exit code
of the command that stops on it (`exit_code`). `error_line` makes that line, choosing by
`isinstance`, never by a class's dotted name, and `print_error` is the one place that
prints an `error:` line (the dispatcher, and the commands that report an error and go on
to exit with their own code). Messages never carry a secret (no key bytes, no raw private
input): they are printed as they are.

Dependency-free on purpose: the core imports it, and the core imports nothing outside
itself but this module.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import ClassVar, TextIO

__all__ = ["ProcessorError", "RefusedError", "StreamError", "UsageError", "error_line",
           "print_error"]

#: The exit code of a command that stops on an error (a usage error included).
EXIT_ERROR = 2


class ProcessorError(Exception):
    """Root of every error the project raises on purpose."""

    #: Put before the message in the one `error:` line (e.g. "state: ").
    error_prefix: ClassVar[str] = ""
    #: The exit code of a command that stops on this error.
    exit_code: ClassVar[int] = EXIT_ERROR


class StreamError(ProcessorError):
    """The stream layer's branch: the worker, ingest, replay and the brokers."""


class RefusedError(StreamError, RuntimeError):
    """The worker refuses a record rather than continue under a guarantee nobody configured
    (an announced counter without state, a key or parameter that differs from the stored
    state's). Raised before anything of the record is published; the message names only
    public things and the remedy. A RuntimeError too: what catches RuntimeError catches it."""


class UsageError(ProcessorError):
    """A command line argparse refused (raised instead of argparse's usage + exit)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message} (see {prog} --help)")


def error_line(exc: BaseException,
               foreign: Sequence[tuple[type[BaseException], str]] = ()) -> str:
    """The one `error: ...` line of an exception: a ProcessorError under its
    `error_prefix`, an error of another library under the prefix `foreign` gives its class
    (most specific first), a timeout or an OS error as such, any other exception named by
    its type. Never a traceback, never more than one line."""
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    if isinstance(exc, UsageError):
        return f"error: {exc}"
    if isinstance(exc, ProcessorError):
        return f"error: {exc.error_prefix}{text}"
    builtin: tuple[tuple[type[BaseException], str], ...] = (
        (TimeoutError, "timed out: "), (OSError, ""))
    for cls, prefix in (*foreign, *builtin):
        if isinstance(exc, cls):
            return f"error: {prefix}{text}"
    return f"error: {type(exc).__name__}: {text}"


def print_error(what: str | BaseException, file: TextIO | None = None, *,
                flush: bool = False,
                foreign: Sequence[tuple[type[BaseException], str]] = ()) -> None:
    """Print one `error:` line on `file` (default: standard error): an exception's line
    (`error_line`, with `foreign`'s prefixes), or `error: ` and a message a command wrote
    itself."""
    line = (error_line(what, foreign) if isinstance(what, BaseException)
            else f"error: {what}")
    print(line, file=sys.stderr if file is None else file, flush=flush)
