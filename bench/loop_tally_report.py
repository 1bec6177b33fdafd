"""Rates from the event-loop tally (`bench/loop_tally/sitecustomize.py`): per thread, each
source's callbacks per second and its CPU-ms per second, between two snapshots of one
process's `<prefix>.<pid>.jsonl`.

    DPC_LOOP_TALLY=/tmp/tally PYTHONPATH=bench/loop_tally .venv/bin/python \\
        bench/bench_stream.py --phase idle --counters 200 --tick-ms 100 ...
    .venv/bin/python bench/loop_tally_report.py /tmp/tally.<worker pid>.jsonl --last 30

The window: the snapshots nearest to `--from`/`--to` (epoch seconds), or the last
`--last` seconds before the final snapshot (a worker's last snapshot is its exit, after
the bench's window: pick the window by time then). CPU is the thread's CPU inside each
callback; a loop's iterations (`LOOP_ITERATION`) include their callbacks and the select.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Row = tuple[str, str, float, float]


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rates(first: dict[str, Any], last: dict[str, Any]) -> list[Row]:
    """(thread, source, callbacks/s, CPU-ms/s) between two snapshots, busiest first."""
    seconds = last["t"] - first["t"]
    if seconds <= 0:
        raise ValueError("the window is empty: pick snapshots at least one interval apart")
    before = {(r[0], r[1]): (r[2], r[3]) for r in first["rows"]}
    out: list[Row] = []
    for thread, name, n, ns in last["rows"]:
        n0, ns0 = before.get((thread, name), (0, 0))
        if n > n0:
            out.append((thread, name, (n - n0) / seconds, (ns - ns0) / seconds / 1e6))
    return sorted(out, key=lambda r: -r[3])


def window(snaps: Sequence[dict[str, Any]], start: float | None, end: float | None,
           last_s: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    if last_s is not None:
        end_snap = snaps[-1]
        target = end_snap["t"] - last_s
    else:
        end_snap = snaps[-1] if end is None else min(snaps, key=lambda s: abs(s["t"] - end))
        target = snaps[0]["t"] if start is None else start
    return min(snaps, key=lambda s: abs(s["t"] - target)), end_snap


def report(rows: Sequence[Row], seconds: float, top: int) -> list[str]:
    lines = [f"window {seconds:.1f} s"]
    for thread in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == thread]
        busy = sum(r[3] for r in mine if r[1] != "LOOP_ITERATION")
        lines.append(f"== {thread}: callbacks {busy:.2f} CPU-ms/s")
        lines += [f"  {r[2]:8.1f}/s {r[3]:7.2f} ms/s  {r[1][:150]}" for r in mine[:top]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tally", type=Path, help="a process's <prefix>.<pid>.jsonl")
    p.add_argument("--from", dest="start", type=float, help="window start, epoch seconds")
    p.add_argument("--to", dest="end", type=float, help="window end, epoch seconds")
    p.add_argument("--last", type=float, help="the last S seconds before the final snapshot")
    p.add_argument("--top", type=int, default=25, help="sources per thread (default 25)")
    args = p.parse_args(argv)
    snaps = load(args.tally)
    first, last = window(snaps, args.start, args.end, args.last)
    for line in report(rates(first, last), last["t"] - first["t"], args.top):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
