"""`CommandParser`: the argument parser of every `python -m processor <command>`.

What the dispatcher (processor.commands.main) needs of a parser, in the parser itself rather than
patched into argparse for the whole process. While the dispatcher runs a command
(`dispatching`): a refused command line raises UsageError (one `error:` line, exit 2)
instead of printing usage and exiting; abbreviations are refused (`--conf` is not
`--config`: a prefix that matches one option today would silently change meaning when an
option is added); and the usage line names the command as it was invoked
(`python -m processor ...` or `dpcount ...`). Called directly (a test, `python -m
processor.experiments`), a CommandParser is a plain argparse.ArgumentParser.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

from processor.errors import UsageError

__all__ = ["PROG", "CommandParser", "dispatching", "pool_worker_signals"]

#: How the commands name themselves in their `prog`: `python -m processor <command>`.
PROG = "python -m processor"

#: The command prefix of the dispatch under way (None: no dispatch, plain argparse).
_DISPATCH: ContextVar[str | None] = ContextVar("dispatch", default=None)


@contextmanager
def dispatching(prog: str) -> Iterator[None]:
    """While the block runs, CommandParsers follow the dispatcher's policy and name
    themselves `prog <command>` (`dpcount` when the script of that name runs)."""
    token = _DISPATCH.set(prog)
    try:
        yield
    finally:
        _DISPATCH.reset(token)


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser that, under the dispatcher, raises UsageError, refuses
    abbreviations and names the command as invoked. Subparsers are CommandParsers too
    (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prog = _DISPATCH.get()
        if prog is not None:
            kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        if prog is not None and prog != PROG and self.prog.startswith(PROG):
            self.prog = prog + self.prog[len(PROG):]

    def error(self, message: str) -> NoReturn:
        if _DISPATCH.get() is None:
            super().error(message)
        raise UsageError(self.prog, message)


def pool_worker_signals() -> None:
    """The initializer of a command's forked worker processes. A fork inherits the
    dispatcher's SIGTERM handler (raise Terminated, processor.commands.main), so a pool's
    terminate() at its end would print one Terminated traceback per process; here SIGTERM
    ends the process quietly, and Ctrl-C is left to the parent (which stops the pool)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
