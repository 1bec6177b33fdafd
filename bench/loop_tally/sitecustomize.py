"""Counts every asyncio callback a process runs, by what it ran, with its thread CPU time:
where an event loop's turns go (Faust's consumer thread runs a loop of its own).

Active only when DPC_LOOP_TALLY names an output prefix and this directory is on the
process's PYTHONPATH (Python imports `sitecustomize` at start); child processes inherit
both, so a bench run's workers are counted too. Each process appends a cumulative
snapshot to `<prefix>.<pid>.jsonl` every DPC_LOOP_TALLY_EVERY_S seconds (default 5) and
at exit; `bench/loop_tally_report.py` turns two snapshots into rates. A task's step is
named by its coroutine and what it awaits (up to four levels); a plain callback by its
qualified name; `LOOP_ITERATION` is each turn of a loop, its select included. Each
callback pays two clock reads and a dictionary update: compare counts, and CPU only
between runs that were both counted. A bench tool, never imported by the project.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import threading
import time
from typing import Any

_PREFIX = os.environ.get("DPC_LOOP_TALLY", "")


def _chain(coro: Any) -> list[str]:
    names: list[str] = []
    while coro is not None and len(names) < 6:
        names.append(getattr(coro, "__qualname__", None) or type(coro).__name__)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return names


def _name(callback: Any) -> str:
    owner = getattr(callback, "__self__", None)
    if owner is not None and hasattr(owner, "get_coro"):
        # mode wraps every service task in the same coroutine: its name says nothing.
        names = [n for n in _chain(owner.get_coro()) if n != "Service._execute_task"]
        return "task:" + ">".join(names[:4])
    return str(getattr(callback, "__qualname__", None) or repr(callback))


def _install(prefix: str) -> None:
    import asyncio.base_events as base_events
    import asyncio.events as events

    counts: collections.defaultdict[tuple[str, str], list[int]] = \
        collections.defaultdict(lambda: [0, 0])
    run = events.Handle._run
    run_once = base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
    clock = time.thread_time_ns

    def counted_run(self: events.Handle) -> None:
        try:
            key = (threading.current_thread().name, _name(self._callback))  # type: ignore[attr-defined]
        except Exception:  # a callback whose name cannot be read: counted anyway
            key = (threading.current_thread().name, "?")
        began = clock()
        try:
            run(self)
        finally:
            entry = counts[key]
            entry[0] += 1
            entry[1] += clock() - began

    def counted_run_once(self: Any) -> None:
        began = clock()
        try:
            run_once(self)
        finally:
            entry = counts[(threading.current_thread().name, "LOOP_ITERATION")]
            entry[0] += 1
            entry[1] += clock() - began

    events.Handle._run = counted_run  # type: ignore[method-assign]
    base_events.BaseEventLoop._run_once = counted_run_once  # type: ignore[attr-defined]
    path = f"{prefix}.{os.getpid()}.jsonl"

    def snapshot() -> None:
        rows = [[thread, name, n, ns] for (thread, name), (n, ns) in list(counts.items())]
        with open(path, "a") as out:
            out.write(json.dumps({"t": time.time(), "rows": rows}) + "\n")

    every = float(os.environ.get("DPC_LOOP_TALLY_EVERY_S", "5"))

    def snapshots() -> None:
        while True:
            time.sleep(every)
            snapshot()

    threading.Thread(target=snapshots, name="loop-tally", daemon=True).start()
    atexit.register(snapshot)


if _PREFIX:
    _install(_PREFIX)
