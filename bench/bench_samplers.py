"""Draws per second of the exact samplers (a script, not a test).

    .venv/bin/python bench/bench_samplers.py [--quick]
    .venv/bin/python bench/bench_samplers.py --keystream

Prints microseconds per draw, best and median wall clock over 7 runs and best process
CPU time (on a shared machine the best run is closest to the code's own cost), for the
vectorised discrete_laplace_block, LaplaceBank.draw used sequentially (the SVT's per-tick
noise), the scalar discrete_laplace at the same scale, and the scalar discrete_gaussian
at sigma ~ 1e6 units. Target: LaplaceBank < 1 us/draw.

`--keystream` instead: the extension's ChaCha20 (`dpc_native.keystream`) in MB/s of
process CPU time, best of 5, for reads of 8 words (one block: the call's own cost), 512
and 4,096 words (in cache) and 2^20 words (8 MB), and one `discrete_laplace_run` call of 1
and of 9 draws at the SVT's scale of an ECC with eps 1 (a new counter's Z_0, its first
dense prefix), in us per call.

`--beside-python` instead: what a restored ECC counter's advance over ⊥ ticks inside
its SVT's dense prefix costs (`ECC.advance_state` with the noise key: a stop's or a
marker's write of an idle counter, 8 draws in the extension), alone and beside a thread
running Python in short bursts as the worker's event loop does, the median of 5 runs of
3,000 counters (contention is what is measured, so not the best run), us of wall clock
and of this thread's CPU per counter; with `DPC_SAMPLERS=reference` the same through the
pure-Python samplers. A native call that gives the GIL up and takes it back pays for the
other thread's bursts: the second line shows it.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from processor.core.ecc import ECC, ecc_parameters
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.block import LaplaceBank, discrete_laplace_block
from processor.core.samplers.native import NATIVE
from processor.core.samplers.scalar import (
    discrete_gaussian,
    discrete_laplace,
    gaussian_sigma2_units,
    laplace_scale_units,
)
from processor.core.svt import svt_scales


def _measure(fn: Callable[[], int], repeats: int = 7) -> tuple[float, float, float]:
    """(best wall, median wall, best cpu) seconds per draw over `repeats` runs of fn.

    fn returns the number of draws it made. On a shared machine the best run is the
    figure closest to the code's own cost; the median shows what contention adds.
    """
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        w1, c1 = time.perf_counter(), time.process_time()
        walls.append((w1 - w0) / n)
        cpus.append((c1 - c0) / n)
    walls.sort()
    return walls[0], walls[len(walls) // 2], min(cpus)


def _cpu_best(fn: Callable[[], object], calls: int, repeats: int = 5) -> float:
    """Best process CPU seconds per call over `repeats` runs of `calls` calls."""
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - c0)
    return best / calls


def keystream() -> None:
    """The --keystream figures (the extension's keystream and draw runs)."""
    if NATIVE is None:
        raise SystemExit("the dpc_native extension is not installed (bash deploy/setup.sh)")
    native = NATIVE
    key = KeyedStream(NoiseKey.from_seed(2026), "bench/keystream").derived_key()
    def read(n: int) -> Callable[[], object]:
        return lambda: native.keystream(key, 0, 0, n)

    def draws(t: int, n: int) -> Callable[[], object]:
        return lambda: native.discrete_laplace_run(key, 0, 0, t, 1, n)

    for n in (8, 512, 4096, 1 << 20):
        per = _cpu_best(read(n), max(2, (1 << 22) // n))
        print(f"keystream {n:>8,} words: {8 * n / per / 1e6:>6,.0f} MB/s ({per * 1e6:,.2f} us)")
    t1 = svt_scales(ecc_parameters(1.0, 1e-6).eps_part)[1]
    for n in (1, 9):
        per = _cpu_best(draws(t1, n), 20_000)
        print(f"discrete_laplace_run t={t1}, {n} draws: {per * 1e6:.2f} us a call")


def beside_python(counters: int = 3000) -> None:
    """The --beside-python figures."""
    key = NoiseKey.from_seed(2026)
    states = []
    for i in range(counters):
        c = ECC(1.0, 1e-6, key, f"bench/advance/{i}")
        c.skip(3)  # inside the SVT's dense prefix: the advance draws
        states.append(c.to_bytes())

    def median() -> tuple[float, float]:
        walls: list[float] = []
        cpus: list[float] = []
        for _ in range(5):
            w0, c0 = time.perf_counter(), time.thread_time()
            for data in states:
                if ECC.advance_state(data, 30, key) is None:
                    raise SystemExit("advance_state refused a quiet advance")
            walls.append((time.perf_counter() - w0) / counters)
            cpus.append((time.thread_time() - c0) / counters)
        return sorted(walls)[2], sorted(cpus)[2]

    stop = threading.Event()

    def bursts() -> None:
        x = 0
        while not stop.is_set():
            time.sleep(0.0002)
            for i in range(300):  # about 10 us of Python
                x += i

    print(f"samplers: {'native' if NATIVE is not None else 'reference'}")
    wall, cpu = median()
    print(f"advance_state, dense prefix, alone:          {wall * 1e6:6.1f} us wall, "
          f"{cpu * 1e6:6.1f} us CPU a counter")
    other = threading.Thread(target=bursts, daemon=True)
    other.start()
    try:
        wall, cpu = median()
    finally:
        stop.set()
        other.join()
    print(f"the same beside a thread's Python bursts:    {wall * 1e6:6.1f} us wall, "
          f"{cpu * 1e6:6.1f} us CPU a counter")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer draws")
    ap.add_argument("--keystream", action="store_true",
                    help="the extension's keystream and draw runs instead (see the doc)")
    ap.add_argument("--beside-python", action="store_true",
                    help="a restored counter's advance alone and beside a busy Python "
                    "thread instead (see the doc)")
    args = ap.parse_args()
    other = (beside_python if args.beside_python
             else keystream if args.keystream else None)
    if other is not None:
        other()
        return
    scale = 1 if args.quick else 4

    key = NoiseKey.from_seed(2026)
    t = laplace_scale_units(4 * 51 / 1.0)  # the SVT's Lap(4/eps_p), eps_p = eps/51, eps = 1
    num, den = gaussian_sigma2_units(1e6)
    rows: list[tuple[str, float, float, float]] = []

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

    rows.append(("discrete_laplace_block n=1024", *_measure(block(1024, 4 * scale))))
    rows.append(("discrete_laplace_block n=16384", *_measure(block(16384, scale))))
    rows.append(("LaplaceBank.draw (chunk 1024), sequential",
                 *_measure(bank(4096 * scale))))
    rows.append(("discrete_laplace scalar", *_measure(scalar_lap(300 * scale))))
    rows.append(("discrete_gaussian scalar, sigma=1e6 units",
                 *_measure(scalar_gauss(100 * scale))))

    print(f"t = {t} units (Laplace scale 204 events); sigma^2 = {num}/{den} units^2")
    print(f"{'sampler':<44} {'best us':>8} {'median us':>10} {'best cpu us':>12}"
          f" {'draws/s (best)':>15}")
    for name, best, median, cpu in rows:
        print(f"{name:<44} {best * 1e6:>8.3f} {median * 1e6:>10.3f} {cpu * 1e6:>12.3f}"
              f" {1 / best:>15,.0f}")


if __name__ == "__main__":
    main()
