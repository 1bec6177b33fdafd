"""The one error hierarchy of the project: a root, a branch per layer, a "refused" family.

```
ProcessorError                       root: every error raised on purpose
├── processor.core.errors.CoreError  the privacy core (input, parameter, state, noise key)
├── StreamError                      the stream layer (worker, ingest, replay, brokers)
│   └── RefusedError                 the worker refuses to go on with stored state: an
│                                    announced counter whose state is gone, a noise key
│                                    that differs from the state's, a parameter change
├── UsageError                       a command line the parser refused
└── TickSyntaxError (offline.py)     a malformed tick file of `count`
```

Each class carries the prefix of its one `error:` line (`error_prefix`) and the exit code
of the command that stops on it (`exit_code`); `processor.cli` prints that line, choosing
by `isinstance`, never by a class's dotted name. Messages never carry a secret (no key
bytes, no raw private input): they are printed as they are.

Dependency-free on purpose: the core imports it, and the core imports nothing outside
itself but this module.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ProcessorError", "RefusedError", "StreamError", "UsageError"]

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
    public things and the remedy. A RuntimeError too, as these errors were before."""


class UsageError(ProcessorError):
    """A command line argparse refused (raised instead of argparse's usage + exit)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message} (see {prog} --help)")
