"""Draws per second of the exact samplers (a script, not a test).

    .venv/bin/python bench/bench_samplers.py [--quick]

Prints wall-clock and process-CPU microseconds per draw (CPU time is the fairer figure on
a shared machine) for: the vectorised discrete_laplace_block, LaplaceBank.draw used
sequentially (the SVT's per-tick noise), the scalar discrete_laplace at the same scale,
and the scalar discrete_gaussian at sigma ~ 1e6 units. Target: LaplaceBank < 1 us/draw.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers import (
    LaplaceBank,
    discrete_gaussian,
    discrete_laplace,
    discrete_laplace_block,
    gaussian_sigma2_units,
    laplace_scale_units,
)


def _measure(fn: Callable[[], int], repeats: int = 3) -> tuple[float, float]:
    """Best (wall, cpu) seconds per draw over `repeats` runs of fn (fn returns #draws)."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        w1, c1 = time.perf_counter(), time.process_time()
        best_wall = min(best_wall, (w1 - w0) / n)
        best_cpu = min(best_cpu, (c1 - c0) / n)
    return best_wall, best_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer draws")
    args = ap.parse_args()
    scale = 1 if args.quick else 4

    key = NoiseKey.from_seed(2026)
    t = laplace_scale_units(4 * 51 / 1.0)  # the SVT's Lap(4/eps_p), eps_p = eps/51, eps = 1
    num, den = gaussian_sigma2_units(1e6)
    rows: list[tuple[str, float, float]] = []

    def block(n: int, blocks: int) -> Callable[[], int]:
        st = KeyedStream(key, f"bench/block/{n}")

        def run() -> int:
            for lane in range(1, blocks + 1):
                discrete_laplace_block(st, lane, t, 1, n)
            return n * blocks
        return run

    def bank(draws: int) -> Callable[[], int]:
        def run() -> int:
            b = LaplaceBank(KeyedStream(key, "bench/bank"), t)
            for i in range(draws):
                b.draw(i)
            return draws
        return run

    def scalar_lap(draws: int) -> Callable[[], int]:
        def run() -> int:
            cur = WordCursor(KeyedStream(key, "bench/lap"))
            for _ in range(draws):
                discrete_laplace(cur, t, 1)
            return draws
        return run

    def scalar_gauss(draws: int) -> Callable[[], int]:
        def run() -> int:
            cur = WordCursor(KeyedStream(key, "bench/gauss"))
            for _ in range(draws):
                discrete_gaussian(cur, num, den)
            return draws
        return run

    rows.append(("discrete_laplace_block n=1024", *_measure(block(1024, 8 * scale))))
    rows.append(("discrete_laplace_block n=16384", *_measure(block(16384, scale))))
    rows.append(("LaplaceBank.draw (chunk 1024), sequential",
                 *_measure(bank(16384 * scale))))
    rows.append(("discrete_laplace scalar", *_measure(scalar_lap(1000 * scale))))
    rows.append(("discrete_gaussian scalar, sigma=1e6 units",
                 *_measure(scalar_gauss(300 * scale))))

    print(f"t = {t} units (Laplace scale 204 events); sigma^2 = {num}/{den} units^2")
    print(f"{'sampler':<44} {'wall us/draw':>13} {'cpu us/draw':>12} {'draws/s (cpu)':>14}")
    for name, wall, cpu in rows:
        print(f"{name:<44} {wall * 1e6:>13.3f} {cpu * 1e6:>12.3f} {1 / cpu:>14,.0f}")


if __name__ == "__main__":
    main()
