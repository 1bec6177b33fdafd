"""`python -m processor.experiments bounds`: SimECC's published error bound against the
actual error, on the vectorised simulator.

Two streams: the Figure 1a stream (rates 0.1/0.9 in blocks of 10), where the ratio of the
bound to the 95th percentile of |y_t - s_t| is measured at every tick, and the all-ones
stream (the worst case for the bound: every tick of lag is an event of error), where the
per-tick coverage P(|y_t - s_t| <= bound) is measured. Writes bounds.csv (one row per
tick: t, bound, p95 and coverage on each stream) and bounds.png.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from processor.core.bounds import simecc_bound
from processor.experiments import attack
from processor.simulator.simulate import simulate

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class BoundReport:
    """The per-tick series and the figures the issue asks for."""

    eps: float
    delta: float
    beta: float
    runs: int
    bound: FloatArray
    p95: FloatArray  # Figure 1a stream
    coverage: FloatArray  # all-ones stream
    p95_ones: FloatArray

    @property
    def ratio(self) -> FloatArray:
        return self.bound / np.maximum(self.p95, 1e-12)

    def summary(self) -> str:
        late = self.ratio[99:]
        worst = int(np.argmax(late)) + 100
        return (f"SimECC eps = {self.eps:g}, delta = {self.delta:g}, beta = {self.beta:g}, "
                f"{self.runs} runs, T = {self.bound.size}: bound / p95 at the end "
                f"{self.ratio[-1]:.2f}, worst over t >= 100 {late.max():.2f} (t = {worst}); "
                f"coverage on all-ones input: min over t {self.coverage.min():.4f}, "
                f"mean {self.coverage.mean():.4f}; bound / p95 there at the end "
                f"{self.bound[-1] / self.p95_ones[-1]:.2f}")


def measure(eps: float, delta: float, beta: float, runs: int, horizon: int, base: str,
            calibration: str, seed: int) -> BoundReport:
    bound = np.array([simecc_bound(eps, delta, beta, t, base, calibration)
                      for t in range(1, horizon + 1)])
    rates = attack.block_rates(horizon)
    x, _ = attack.draw_trials(rates, runs, np.random.default_rng([seed, 0]))
    err = np.abs(simulate("simecc", x, eps, delta, np.random.default_rng([seed, 1]), base,
                          calibration) - np.cumsum(x, axis=1))
    p95 = np.quantile(err, 0.95, axis=0)
    del err
    ones = np.ones((runs, horizon), dtype=np.int8)
    err = np.abs(simulate("simecc", ones, eps, delta, np.random.default_rng([seed, 2]), base,
                          calibration) - np.cumsum(ones, axis=1))
    coverage = np.mean(err <= bound[None, :], axis=0)
    return BoundReport(eps, delta, beta, runs, bound, p95, coverage,
                       np.quantile(err, 0.95, axis=0))


def write(report: BoundReport, out: Path) -> None:
    with open(out / "bounds.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t", "bound", "p95_fig1a", "ratio_fig1a", "p95_all_ones",
                    "coverage_all_ones"])
        for i in range(report.bound.size):
            w.writerow([i + 1, f"{report.bound[i]:.2f}", f"{report.p95[i]:.2f}",
                        f"{report.ratio[i]:.3f}", f"{report.p95_ones[i]:.2f}",
                        f"{report.coverage[i]:.4f}"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(1, report.bound.size + 1)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(t, report.bound, label="published bound (per tick, 1 - beta)")
    ax[0].plot(t, report.p95_ones, label="p95 |error|, all-ones stream")
    ax[0].plot(t, report.p95, label="p95 |error|, Figure 1a stream")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("t")
    ax[0].set_ylabel("events")
    ax[0].legend(fontsize=8)
    ax[1].plot(t, report.ratio)
    ax[1].axhline(3.0, ls="--", c="gray")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("t")
    ax[1].set_ylabel("bound / p95 (Figure 1a stream)")
    fig.suptitle(f"SimECC eps = {report.eps:g}, delta = {report.delta:g}, "
                 f"{report.runs} runs")
    fig.tight_layout()
    fig.savefig(out / "bounds.png", dpi=110)
    plt.close(fig)
