"""Benchmark of the vectorised Section 8 simulator (a script, not a test).

    nice -n 10 .venv/bin/python bench/bench_experiments.py            # component table, ~1-2 min
    nice -n 10 .venv/bin/python bench/bench_experiments.py --full     # + full Fig. 1a and 1b

The component table gives, per mechanism, the simulated ticks per second (runs x T per
wall-clock second) for one chunk at T = 10^4 and two eps, and for ECC / SimECC /
GaussianCC at the Figure 1b setting T = 10^5, 100 runs. --full times the complete
`fig1a` (12 eps, 4 mechanisms, 20,000 runs, T = 10^4) and `fig1b` (T = 10^3..10^6, 100 runs)
commands, writing into --out. The machine is shared: run it niced and read the numbers
with the load average printed next to them.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from processor.experiments import attack, figures
from processor.experiments.cli import main_experiment
from processor.simulator.simulate import simulate


def _time_sim(name: str, runs: int, horizon: int, eps: float, rate: float | None) -> float:
    rng = np.random.default_rng(1)
    if rate is None:
        x, _ = attack.draw_trials(attack.block_rates(horizon), runs, rng)
    else:
        x = (rng.random((runs, horizon)) < rate).astype(np.int8)
    t0 = time.perf_counter()
    simulate(name, x, eps, 1e-5, np.random.default_rng(2))
    return time.perf_counter() - t0


def components() -> None:
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores)")
    print(f"{'mechanism':12s} {'T':>8s} {'runs':>6s} {'eps':>6s} {'seconds':>8s} "
          f"{'Mticks/s':>9s}")
    for name in ("basecc", "partitioncc", "gaussiancc", "simecc", "ecc"):
        for eps in (1.0, 150.0):
            dt = _time_sim(name, 2000, 10_000, eps, None)
            print(f"{name:12s} {10_000:8d} {2000:6d} {eps:6g} {dt:8.2f} "
                  f"{2000 * 10_000 / dt / 1e6:9.1f}")
    for name in ("ecc", "simecc", "gaussiancc"):
        dt = _time_sim(name, 100, 100_000, 10.0, 0.01)
        print(f"{name:12s} {100_000:8d} {100:6d} {10.0:6g} {dt:8.2f} "
              f"{100 * 100_000 / dt / 1e6:9.1f}")
    # the fast sweep path: all 12 eps of BaseCC from one draw
    setup = figures.Setup(horizon=10_000, runs=2000)
    t0 = time.perf_counter()
    figures.additive_sweep(setup, "basecc", figures.EPS_SWEEP)
    print(f"basecc 12-eps sweep, 2000 runs, T = 10^4: {time.perf_counter() - t0:.2f} s")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


def full(out: Path, jobs: int) -> None:
    for argv in (["fig1a", "--out", str(out), "--jobs", str(jobs)],
                 ["fig1b", "--out", str(out), "--jobs", str(jobs)]):
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        main_experiment(argv)
        print(f"{' '.join(argv)}: {time.perf_counter() - t0:.1f} s wall "
              f"(load average {load:.2f} -> {os.getloadavg()[0]:.2f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--full", action="store_true", help="also time the full fig1a and fig1b")
    p.add_argument("--out", type=Path, default=Path("experiments-out"))
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    components()
    if args.full:
        full(args.out, args.jobs)


if __name__ == "__main__":
    main()
