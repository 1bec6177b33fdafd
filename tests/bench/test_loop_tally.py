"""bench/loop_tally: the event-loop callback tally and its report.

A child interpreter with the tally's directory on its PYTHONPATH runs a small asyncio
program (a task that sleeps 40 times, a plain callback scheduled 25 times); its snapshot
at exit must count the task's steps under the task's coroutine, the callback under its
name and the loop's turns, and the report must turn two snapshots into the rates they
imply. Control: the same program without DPC_LOOP_TALLY writes nothing (the hook is off
unless asked for, so a bench run is never slowed by it by accident).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import loop_tally_report  # noqa: E402

PROGRAM = """
import asyncio

def plain_callback():
    pass

async def ticker():
    for _ in range(40):
        await asyncio.sleep(0)

async def main():
    loop = asyncio.get_running_loop()
    for _ in range(25):
        loop.call_soon(plain_callback)
    await asyncio.create_task(ticker())

asyncio.run(main())
"""


def _run(tmp_path: Path, tally: bool) -> list[Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPC_LOOP_TALLY")}
    env["PYTHONPATH"] = str(ROOT / "bench" / "loop_tally")
    if tally:
        env["DPC_LOOP_TALLY"] = str(tmp_path / "tally")
        env["DPC_LOOP_TALLY_EVERY_S"] = "3600"  # the exit's snapshot only
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=60)
    return sorted(tmp_path.glob("tally.*.jsonl"))


def test_the_tally_counts_each_source_and_the_report_gives_rates(tmp_path: Path) -> None:
    assert _run(tmp_path, tally=False) == []  # control: off unless asked for
    files = _run(tmp_path, tally=True)
    assert len(files) == 1
    snaps = loop_tally_report.load(files[0])
    assert len(snaps) == 1
    counts = {(thread, name): n for thread, name, n, _ns in snaps[0]["rows"]}
    steps = sum(n for (thread, name), n in counts.items()
                if thread == "MainThread" and name.startswith("task:ticker"))
    assert steps >= 41, counts  # its first step and one after each of its 40 sleeps
    assert counts[("MainThread", "plain_callback")] == 25
    assert counts[("MainThread", "LOOP_ITERATION")] >= 41
    # Two snapshots 2 s apart: the report's rates are the differences over 2 s.
    first = {"t": 100.0, "rows": [["T", "a", 10, 4_000_000], ["T", "b", 5, 0]]}
    last = {"t": 102.0, "rows": [["T", "a", 30, 10_000_000], ["T", "b", 5, 0],
                                 ["U", "c", 4, 2_000_000]]}
    rows = loop_tally_report.rates(first, last)
    assert rows == [("T", "a", 10.0, 3.0), ("U", "c", 2.0, 1.0)]  # "b" did not run
    first_w, last_w = loop_tally_report.window([first, last], None, None, 2.0)
    assert (first_w, last_w) == (first, last)
