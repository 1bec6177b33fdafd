"""The base counter of CC and BCC: BLT against the square root and the old tree (a script).

    .venv/bin/python bench/bench_base.py [--ticks 5000] [--json out.json]
    .venv/bin/python bench/bench_base.py --fit D [--rounds 8] [--nmax-bits 36]
    .venv/bin/python bench/bench_base.py --rmse RUNS [--mechanism simecc] [--rmse-eps 150]

Default mode prints
1. the worst-case sigma ratio against the exact square-root factorisation, from the
   closed forms (no sampling): for a bounded counter of horizon n, max_t sigma_t is
   ||column 1 of C|| ||row n of B|| times the Gaussian constant, so the ratio is
   sqrt(blt_col_norm2(n) blt_row_norm2(n)) / sum_{k<n} c_k^2 (the square root's own
   product); the same for the Gaussian tree (sqrt(levels) sqrt(max popcount <= n));
   and the unbounded CC's cc_sigma with base "blt" against base "sqrt" at t;
2. the per-tick time (ticks/s) of the bare bounded counters (BLT, tree) and of the
   unbounded CC with each base.

--rmse RUNS measures the issue's target: the mean per-run RMSE of a mechanism on the
Figure 1a streams (T = 10^4, rates 0.1 / 0.9 in blocks of 10, delta = 1e-5, the
experiments' trial streams for seed 0) through `python -m processor count`, one
subprocess per run (seed i, counter id run<i>), which runs the stream's default base.

--fit D refits the BLT constants with D buffers (Nelder-Mead restarts on the log of the
two norm ratios over a log grid of horizons up to 2^24) and prints THETA_NUM / OMEGA_NUM
as committed in processor/core/blt.py (a new fit needs a new BLT_VERSION).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.core import blt
from processor.core.bounded import GaussianTree, tree_levels
from processor.core.cc import UnboundedCC, cc_sigma
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey

NMAX = 1 << 24


def tree_ratio(n: int, s2: float) -> float:
    """Worst-case sigma of the Gaussian tree of horizon n over the square root's (same
    calibration constant): sqrt(levels * max popcount(t <= n)) / sum_{k<n} c_k^2."""
    maxpop = max(n.bit_count(), n.bit_length() - 1)
    return math.sqrt(tree_levels(n) * maxpop) / s2


def ratio_table(ns: list[int]) -> list[dict[str, float]]:
    s2 = blt.sqrt_norm2_at(ns)
    rows = []
    for n, s in zip(ns, s2, strict=True):
        rows.append({"n": n, "blt": math.sqrt(blt.blt_col_norm2(n) * blt.blt_row_norm2(n)) / s,
                     "tree": tree_ratio(n, s)})
    return rows


def cc_table(ts: list[int], eps: float, delta: float) -> list[dict[str, float]]:
    rows = []
    for t in ts:
        sq = cc_sigma(eps, delta, t, "sqrt")
        rows.append({"t": t, "blt": cc_sigma(eps, delta, t, "blt") / sq,
                     "tree": cc_sigma(eps, delta, t, "tree") / sq})
    return rows


def ticks_per_s(make: Any, ticks: int) -> float:
    c = make()
    rng = np.random.default_rng(3)
    xs = [int(v) * UNIT for v in rng.integers(0, 2, ticks)]
    t0 = time.perf_counter()
    for u in xs:
        c.step(u)
    return ticks / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- the fit


def _geo_vec(r: np.ndarray, t: np.ndarray) -> np.ndarray:
    r, t = np.broadcast_arrays(r, t)
    pos = r > 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(np.where(pos, r, 0.75))
        gp = np.where(lr == 0.0, t, np.expm1(t * lr) / np.expm1(lr))
        gn = (1.0 - np.power(r, t)) / (1.0 - r)
    return np.where(pos, gp, gn)


def _norms(theta: np.ndarray, omega: np.ndarray, grid: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """(col2(n), row2(n)) on the grid (float closed forms; the fit's speed matters more
    than the last digits, the committed constants are re-checked by the core's functions)."""
    d = len(theta)
    c2 = 1.0 + np.einsum("ij,ijn->n", np.outer(omega, omega),
                         _geo_vec(np.outer(theta, theta)[:, :, None], (grid - 1)[None, None, :]))
    m = np.diag(theta) - np.outer(np.ones(d), omega)
    phi, v = np.linalg.eig(m)
    if np.max(np.abs(phi.imag)) > 0 or np.any(np.abs(phi.real) >= 1):
        return None
    phi, v = phi.real, v.real
    a = -(omega @ v) * np.linalg.solve(v, np.ones(d))
    big_a = a / (1.0 - phi)
    beta = np.concatenate([[1.0 + big_a.sum()], -big_a])
    ph = np.concatenate([[1.0], phi])
    b2 = np.einsum("ij,ijn->n", np.outer(beta, beta),
                   _geo_vec(np.outer(ph, ph)[:, :, None], grid[None, None, :]))
    return c2, b2


def sqrt_norm2_any(ns: list[int]) -> list[float]:
    """sqrt_norm2_at up to 2^24; beyond, the expansion (ln n + gamma + 4 ln 2) / pi, whose
    error is below 1e-6 / n there (checked against the recurrence at 10^5..10^7)."""
    small = [n for n in ns if n <= NMAX]
    exact = dict(zip(small, blt.sqrt_norm2_at(small), strict=True))
    gamma = 0.5772156649015329
    return [exact[n] if n <= NMAX else (math.log(n) + gamma + 4 * math.log(2)) / math.pi
            for n in ns]


def fit(d: int, rounds: int, nmax: int) -> tuple[list[int], list[int]]:
    from scipy.optimize import minimize

    grid_i = np.unique(np.concatenate([
        np.round(np.logspace(0, math.log10(nmax), 200)).astype(np.int64),
        (1 << np.arange(1, nmax.bit_length())) - 1]))
    s2 = np.array(sqrt_norm2_any([int(v) for v in grid_i]))
    grid = grid_i.astype(np.float64)

    def unpack(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.exp(-np.exp(p[:d])), np.exp(p[d:])

    def objective(p: np.ndarray) -> float:
        r = _norms(*unpack(p), grid)
        if r is None or np.any(r[0] <= 0) or np.any(r[1] <= 0):
            return 10.0
        rc, rb = 0.5 * np.log(r[0] / s2), 0.5 * np.log(r[1] / s2)
        # max col ratio times max row ratio bounds every (horizon, t <= horizon) pair
        return float(max(rc.max(), 0.0) + max(rb.max(), 0.0) + 1e-3 * (rc + rb).max())

    # Start: a sum of exponentials for k^(-1/2) / sqrt(pi) = (1/pi) int s^(-1/2) e^(-sk) ds
    # by the rectangle rule in log s, decay rates from 1 / (3 NMAX) to 1.5.
    u = np.linspace(math.log(1.0 / (3 * nmax)), math.log(1.5), d)
    rate = np.exp(u)
    weight = (u[1] - u[0]) / math.pi * np.exp(u / 2) * np.exp(-rate)
    best = np.concatenate([np.log(rate), np.log(weight)])
    for i in range(rounds):
        res = minimize(objective, best, method="Nelder-Mead",
                       options={"maxiter": 4000, "maxfev": 4000, "xatol": 1e-9,
                                "fatol": 1e-12, "adaptive": True})
        best = res.x
        print(f"round {i}: bound on the ratio {math.exp(res.fun):.5f}", flush=True)
    theta, omega = unpack(best)
    one = 1 << blt.PARAM_BITS
    return [round(float(t) * one) for t in theta], [round(float(o) * one) for o in omega]


def rmse_through_count(runs: int, mechanism: str, eps: float, extra: list[str]) -> None:
    import subprocess
    import tempfile

    from processor.experiments import attack

    rates = attack.block_rates(10_000)
    x, _ = attack.draw_trials(rates, runs, np.random.default_rng(0))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            path = Path(tmp) / f"run{i}.txt"
            path.write_text("\n".join(str(int(v)) for v in x[i]) + "\n")
            cmd = [sys.executable, "-m", "processor", "count", "--mechanism", mechanism,
                   "--epsilon", str(eps), "--delta", "1e-5", "--seed", str(i),
                   "--counter-id", f"run{i}", "--input", str(path), *extra]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                 cwd=Path(__file__).resolve().parents[1])
            y = np.array([json.loads(line)["y"] for line in res.stdout.splitlines()])
            out.append(float(np.sqrt(np.mean((y - np.cumsum(x[i])) ** 2))))
    a = np.array(out)
    print(f"{mechanism} eps = {eps}: mean per-run RMSE {a.mean():.2f} "
          f"(se {a.std(ddof=1) / math.sqrt(runs):.2f}, {runs} runs) through "
          f"python -m processor count --mechanism {mechanism} --epsilon {eps} "
          f"--delta 1e-5 --seed i --counter-id run<i> {' '.join(extra)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=5000)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--json", help="write the tables here too")
    ap.add_argument("--fit", type=int, metavar="D", help="refit the constants with D buffers")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rmse", type=int, metavar="RUNS", help="measure RMSE through count")
    ap.add_argument("--mechanism", default="simecc")
    ap.add_argument("--rmse-eps", type=float, default=150.0)
    ap.add_argument("--count-args", default="", help="extra arguments for count")
    ap.add_argument("--nmax-bits", type=int, default=36,
                    help="fit horizons up to 2^this (default 36)")
    ap.add_argument("--cc-max", type=int, default=10**6,
                    help="largest t of the unbounded-CC table (base sqrt needs O(t) memory)")
    args = ap.parse_args(argv)
    if args.rmse:
        rmse_through_count(args.rmse, args.mechanism, args.rmse_eps, args.count_args.split())
        return 0
    if args.fit:
        th, om = fit(args.fit, args.rounds, 1 << args.nmax_bits)
        print(f"THETA_NUM = {tuple(th)}\nOMEGA_NUM = {tuple(om)}")
        return 0

    ns = sorted({*(10**k for k in range(0, 8)), *((1 << k) - 1 for k in range(1, 25)),
                 *(int(3 * 10**k) for k in range(0, 7))})
    table = ratio_table(ns)
    print(f"BLT base: d = {len(blt.THETA_NUM)} buffers, constants version {blt.BLT_VERSION}")
    print("\n1a. bounded counter of horizon n: worst-case sigma / the square root's")
    print(f"{'n':>10} {'BLT':>8} {'tree':>8}")
    for r in table:
        print(f"{r['n']:>10} {r['blt']:>8.4f} {r['tree']:>8.4f}")
    print(f"max over n <= 10^7: BLT {max(r['blt'] for r in table if r['n'] <= 10**7):.4f}")

    ts = [t for t in sorted({*(10**k for k in range(1, 8)), *(int(3 * 10**k) for k in range(1, 7)),
                             *((1 << k) - 2 for k in range(2, 24))}) if t <= args.cc_max]
    cc = cc_table(ts, args.eps, args.delta)
    print(f"\n1b. unbounded CC (eps = {args.eps}, delta = {args.delta}): sigma_t / base sqrt's")
    print(f"{'t':>10} {'BLT':>8} {'tree':>8}")
    for r in cc:
        print(f"{r['t']:>10} {r['blt']:>8.4f} {r['tree']:>8.4f}")

    key = NoiseKey.from_seed(1)
    n = args.ticks
    speeds = {
        "blt (bounded, horizon 2^20)": ticks_per_s(
            lambda: blt.BLTCounter(args.eps, args.delta, 1 << 20, key, "b"), n),
        "tree (bounded, horizon 2^20)": ticks_per_s(
            lambda: GaussianTree(args.eps, args.delta, 1 << 20, key, "t"), n),
        "unbounded CC, base blt": ticks_per_s(
            lambda: UnboundedCC(args.eps, args.delta, key, "cb", UNIT, "blt"), n),
        "unbounded CC, base tree": ticks_per_s(
            lambda: UnboundedCC(args.eps, args.delta, key, "ct", UNIT, "tree"), n),
    }
    print(f"\n2. per-tick time over {n} ticks (dense 0/1 input)")
    for name, v in speeds.items():
        print(f"{name:<32} {v:>10.0f} ticks/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"bounded": table, "cc": cc, "ticks_per_s": speeds},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
