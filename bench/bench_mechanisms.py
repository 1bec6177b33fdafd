"""Throughput and state-size benchmark of ECC and SimECC (prints tables; CPU time, so a
busy machine does not distort it; a few seconds per case).

    .venv/bin/python bench/bench_mechanisms.py [--eps 1.0] [--delta 1e-5] [--seconds 2]

- ticks/s on a dense stream (x = 1 w.p. 0.5) and a 1%-dense stream, feeding every tick with
  update() ("dense") or runs of ⊥ with skip() ("skip");
- the cost of one skip(n) for n = 10 .. 10^6 on an instance that has seen some events;
- the serialized state size against t on the 1%-dense stream;
- the cost of to_bytes / from_bytes (the stream operator encodes each touched counter once
  per batch and decodes it on a cache miss).
"""

from __future__ import annotations

import argparse
import time
import timeit

import numpy as np

from processor.core.ecc import ECC, SimECC
from processor.core.rng import NoiseKey

MECHS: list[type[ECC] | type[SimECC]] = [ECC, SimECC]


def stream(density: float, n: int, seed: int) -> list[float | None]:
    rng = np.random.default_rng(seed)
    return [1.0 if r < density else None for r in rng.random(n)]


def feed(m: ECC | SimECC, xs: list[float | None], use_skip: bool, budget: float) -> int:
    """Feed xs until done or out of time; return the ticks processed."""
    start = time.process_time()
    i = 0
    while i < len(xs) and time.process_time() - start < budget:
        if use_skip and xs[i] is None:
            j = i
            while j < len(xs) and xs[j] is None:
                j += 1
            m.skip(j - i)
            i = j
        else:
            m.update(xs[i])
            i += 1
    return i


def throughput(args: argparse.Namespace) -> None:
    print(f"\nticks/s (eps={args.eps}, delta={args.delta}, <= {args.seconds}s per case)")
    print(f"{'mechanism':10} {'stream':10} {'feeding':8} {'ticks':>10} {'ticks/s':>12}")
    key = NoiseKey.from_seed(1)
    for cls in MECHS:
        for density, n in ((0.5, 200_000), (0.01, 2_000_000)):
            xs = stream(density, n, 2)
            for use_skip in (False, True):
                m = cls(args.eps, args.delta, key, "bench")
                t0 = time.process_time()
                done = feed(m, xs, use_skip, args.seconds)
                dt = time.process_time() - t0
                print(f"{cls.mechanism:10} {density:<10} {'skip' if use_skip else 'dense':8} "
                      f"{done:>10} {done / dt:>12,.0f}")


def skip_cost(args: argparse.Namespace) -> None:
    print("\ncost of one skip(n) after 2000 ticks of the 1%-dense stream (mean of 5 instances)")
    print(f"{'mechanism':10} {'n':>9} {'ms':>9} {'changes':>8}")
    key = NoiseKey.from_seed(3)
    warm = stream(0.01, 2000, 4)
    for cls in MECHS:
        for n in (10, 100, 1_000, 10_000, 100_000, 1_000_000):
            total = 0.0
            changes = 0
            for r in range(5):
                m = cls(args.eps, args.delta, key, f"skip/{r}")
                feed(m, warm, True, 60.0)
                t0 = time.process_time()
                changes += len(m.skip(n))
                total += time.process_time() - t0
            print(f"{cls.mechanism:10} {n:>9} {1e3 * total / 5:>9.3f} {changes / 5:>8.1f}")


def state_size(args: argparse.Namespace) -> None:
    print("\nstate size (bytes) against t, 1%-dense stream fed with skip")
    print(f"{'mechanism':10} {'t':>9} {'bytes':>7}")
    key = NoiseKey.from_seed(5)
    rng = np.random.default_rng(6)
    for cls in MECHS:
        m = cls(args.eps, args.delta, key, "size")
        for target in (10**3, 10**4, 10**5, 10**6):
            while m.t < target:
                m.update(1.0)
                m.skip(min(int(rng.geometric(0.01)) - 1, target - m.t))
            print(f"{cls.mechanism:10} {m.t:>9} {len(m.to_bytes()):>7}")


def codec(args: argparse.Namespace) -> None:
    print("\nstate codec after 20,000 ticks of the 50%-dense stream (us per call, best of 3)")
    print(f"{'mechanism':10} {'bytes':>7} {'to_bytes':>9} {'from_bytes':>11}")
    key = NoiseKey.from_seed(7)
    xs = stream(0.5, 20_000, 8)
    for cls in MECHS:
        m = cls(args.eps, args.delta, key, "codec")
        feed(m, xs, False, 60.0)
        data = m.to_bytes()
        enc = min(timeit.repeat(m.to_bytes, number=1000, repeat=3)) / 1000
        dec = min(timeit.repeat(lambda: cls.from_bytes(data, key),  # noqa: B023
                                number=300, repeat=3)) / 300
        print(f"{cls.mechanism:10} {len(data):>7} {1e6 * enc:>9.1f} {1e6 * dec:>11.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    throughput(args)
    skip_cost(args)
    state_size(args)
    codec(args)


if __name__ == "__main__":
    main()
