"""ECC's published error bound against its actual error (ECC and W).

`python bench/bench_bounds.py [--eps 1 10 150] [--delta 1e-5] [--horizon 10000]
[--runs 1000] [--calibration paper|tight] [--base blt]` runs the vectorised simulator
(processor/simulator/simulate.py, the core's distributions) on the Figure 1a stream
(rates 0.1/0.9 in blocks of 10) and on the all-ones stream, and prints per eps:
the per-tick bound (processor/core/bounds.ecc_bound) over the empirical (1 - beta)
quantile of |y_t - s_t| at the end and the worst over t >= 100, the same ratio for the
union bound ECC published before (Theorem 4.3's terms, maximised over all ticks), and the
per-tick coverage P(|y_t - s_t| <= bound) at every tick (min over t).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

from processor.core.bounds import ecc_bound
from processor.core.cc import DEFAULT_BASE, bcc_alpha_max, cc_alpha_max
from processor.core.ecc import ecc_part_term
from processor.core.grid import UNIT
from processor.core.params import ecc_parameters
from processor.experiments import attack
from processor.simulator.simulate import simulate

FloatArray = npt.NDArray[np.float64]


def union_bound(eps: float, delta: float, beta: float, t: int, base: str,
                calibration: str) -> float:
    """The bound ECC published before the per-tick one (a union over all ticks)."""
    p = ecc_parameters(eps, delta, calibration)
    b = beta / 3.0
    e_bcc = bcc_alpha_max(p.bcc_eps, p.bcc_delta, t, b, base, UNIT)
    e_cc = cc_alpha_max(p.cc_eps, p.cc_delta, b, t, base, UNIT) / UNIT
    return 2.0 * e_bcc + e_cc + ecc_part_term(eps, delta, b, t, calibration)


def errors(x: npt.NDArray[np.int8], eps: float, delta: float, base: str, calibration: str,
           rng: np.random.Generator) -> FloatArray:
    y = simulate("ecc", x, eps, delta, rng, base, calibration)
    return np.asarray(np.abs(y - np.cumsum(x, axis=1)), dtype=np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 10.0, 150.0])
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--horizon", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--base", default=DEFAULT_BASE)
    ap.add_argument("--calibration", default="paper", choices=["paper", "tight"])
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    ts = np.arange(1, a.horizon + 1)
    q = 1.0 - a.beta
    for eps in a.eps:
        start = time.perf_counter()
        new = np.array([ecc_bound(eps, a.delta, a.beta, int(t), a.base, a.calibration)
                        for t in ts])
        old = np.array([union_bound(eps, a.delta, a.beta, int(t), a.base, a.calibration)
                        for t in ts])
        x, _ = attack.draw_trials(attack.block_rates(a.horizon), a.runs,
                                  np.random.default_rng([a.seed, 0]))
        qa = np.quantile(errors(x, eps, a.delta, a.base, a.calibration,
                                np.random.default_rng([a.seed, 1])), q, axis=0)
        ones = np.ones((a.runs, a.horizon), dtype=np.int8)
        err1 = errors(ones, eps, a.delta, a.base, a.calibration,
                      np.random.default_rng([a.seed, 2]))
        cover = np.mean(err1 <= new[None, :], axis=0)
        q1 = np.quantile(err1, q, axis=0)
        late = slice(99, None)
        rn, ro = new / np.maximum(qa, 1.0), old / np.maximum(qa, 1.0)
        print(f"ECC eps={eps:g} delta={a.delta:g} beta={a.beta:g} {a.calibration} "
              f"base={a.base} T={a.horizon} runs={a.runs}:\n"
              f"  Figure 1a stream: new bound / q{q:g} at T {rn[-1]:.2f} "
              f"(bound {new[-1]:.0f}, q {qa[-1]:.0f}), worst t>=100 {rn[late].max():.2f}"
              f" (t = {int(np.argmax(rn[late])) + 100}); old {ro[-1]:.2f}, worst "
              f"{ro[late].max():.2f}\n"
              f"  all-ones stream: new bound / q{q:g} at T {new[-1] / max(q1[-1], 1):.2f},"
              f" old {old[-1] / max(q1[-1], 1):.2f}; coverage min over t "
              f"{cover.min():.4f} (t = {int(np.argmin(cover)) + 1}), mean "
              f"{cover.mean():.4f}  [{time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
