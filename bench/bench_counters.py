"""Benchmark of the continual counters (a script, not a test).

    .venv/bin/python bench/bench_counters.py [--ticks 20000] [--eps 1.0] [--json out.json]

Reports, for every registered mechanism:
1. throughput in ticks/s on a dense stream (an event every tick) and on a 1%-dense stream
   (events at 1% of ticks, the ⊥ runs between them advanced with skip(), as the stream
   layer does);
2. state size (bytes of to_bytes()) against t;
and, from the pure sigma functions (no sampling):
3. the error each base of the unbounded CC costs: sigma_t with base "tree" against base
   "sqrt" (the exact square-root factorisation) at t = 10^3 .. 10^6, and their ratio.
Inputs come from a seeded numpy generator; noise from the keyed generator with a public
seed key (NoiseKey.from_seed), so runs are reproducible.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core import registry
from processor.core.cc import cc_sigma
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey


def throughput(name: str, eps: float, delta: float, ticks: int, density: float) -> float:
    """Ticks per second over `ticks` ticks with events at the given density."""
    key = NoiseKey.from_seed(1)
    c = registry.make(name, eps, delta, key, "bench")
    rng = np.random.default_rng(5)
    events = np.flatnonzero(rng.random(ticks) < density) + 1
    t0 = time.perf_counter()
    if density >= 1.0:
        for _ in range(ticks):
            c.update(1.0)
    else:
        for e in events:
            gap = int(e) - c.t - 1
            if gap > 0:
                c.skip(gap)
            c.update(1.0)
        if c.t < ticks:
            c.skip(ticks - c.t)
    return ticks / (time.perf_counter() - t0)


def state_sizes(name: str, eps: float, delta: float, points: list[int]) -> dict[int, int]:
    """len(to_bytes()) at each t in points, on a 10%-dense stream."""
    c = registry.make(name, eps, delta, NoiseKey.from_seed(2), "bench")
    rng = np.random.default_rng(6)
    out: dict[int, int] = {}
    for p in points:
        while c.t < p:
            c.update(1.0 if rng.random() < 0.1 else None)
        out[p] = len(c.to_bytes())
    return out


def base_costs(eps: float, delta: float) -> list[dict[str, Any]]:
    rows = []
    for t in (10**3, 10**4, 10**5, 10**6):
        tree = cc_sigma(eps, delta, t, "tree") / UNIT
        sq = cc_sigma(eps, delta, t, "sqrt") / UNIT
        rows.append({"t": t, "sigma_tree": tree, "sigma_sqrt": sq, "ratio": tree / sq})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=20_000)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--state-max-exp", type=int, default=14,
                    help="state size measured at t = 2^10, 2^12, ..., 2^this")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    report: dict[str, Any] = {"eps": a.eps, "delta": a.delta, "ticks": a.ticks,
                              "throughput": {}, "state_bytes": {}}
    print(f"eps={a.eps} delta={a.delta} ticks={a.ticks}")
    print(f"{'mechanism':<12} {'dense t/s':>12} {'1%-dense t/s':>14}")
    for name in registry.names():
        d = throughput(name, a.eps, a.delta, a.ticks, 1.0)
        s = throughput(name, a.eps, a.delta, a.ticks, 0.01)
        report["throughput"][name] = {"dense": d, "sparse_1pct": s}
        print(f"{name:<12} {d:>12.0f} {s:>14.0f}")
    points = [1 << k for k in range(10, a.state_max_exp + 1, 2)]
    print("\nstate bytes at t = " + ", ".join(str(p) for p in points))
    for name in registry.names():
        sizes = state_sizes(name, a.eps, a.delta, points)
        report["state_bytes"][name] = sizes
        print(f"{name:<12} " + " ".join(f"{sizes[p]:>7}" for p in points))
    print("\nUnboundedCC error by base (std of y_t - s_t in events)")
    print(f"{'t':>9} {'tree':>10} {'sqrt':>10} {'tree/sqrt':>10}")
    rows = base_costs(a.eps, a.delta)
    report["base_costs"] = rows
    for r in rows:
        print(f"{r['t']:>9} {r['sigma_tree']:>10.2f} {r['sigma_sqrt']:>10.2f} {r['ratio']:>10.3f}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
