"""Process checks for the tests that kill a parent and expect its children to go with it
(`kafka.tools.die_with_parent`): liveness that counts a zombie as gone, a wrapped child's
exec, a process's descendants, and a poll with a deadline for the survivors."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path


def running(pid: int) -> bool:
    """Whether `pid` is a live process. A zombie counts as gone: an orphan that died is
    reparented to PID 1 (or a subreaper), and some container inits never reap it, so
    kill(pid, 0) would go on answering for a process that has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def program(pid: int) -> str | None:
    """The base name of the executable `pid` runs, or None when it is gone."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None


def exec_done(pid: int, name: str) -> bool:
    """Whether `pid` now runs `name`: setpriv asks for the death signal before it execs,
    so once the wrapped child is `name` the request is in place."""
    return program(pid) == name


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if running(child):
                out.append(child)
                todo.append(child)
    return out


def survivors(pids: Iterable[int], timeout_s: float) -> set[int]:
    """The processes of `pids` still running after `timeout_s` (returns as soon as none
    is)."""
    left = set(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = {pid for pid in left if running(pid)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)
