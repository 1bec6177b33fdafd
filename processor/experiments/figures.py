"""The Section 8 experiments: sweeps, CSV files, figures and Table 1.

Common random numbers, as in the paper: the trials (b, x^(0)) depend only on the seed and
the chunk index, so every mechanism and every eps sees the same input streams; each
(mechanism, eps, chunk) gets its own independent noise generator.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from processor.experiments import attack, exact
from processor.simulator.simulate import (
    MECHANISMS,
    cc_parts,
    cc_scales,
    gaussiancc_sigma_vector,
    simulate,
)

FloatArray = npt.NDArray[np.float64]

#: the paper's eps sweep: 12 values geometrically spaced from 0.1 to 150
EPS_SWEEP: tuple[float, ...] = tuple(float(v) for v in np.geomspace(0.1, 150.0, 12))
DELTA = 1e-5
FIG1A_MECHANISMS = ("basecc", "partitioncc", "gaussiancc", "simecc")
FIG1B_MECHANISMS = ("ecc", "simecc", "gaussiancc")
LABELS = {"basecc": "BaseCC", "partitioncc": "PartitionCC", "gaussiancc": "GaussianCC",
          "simecc": "SimECC", "ecc": "ECC"}
#: elements (runs x T) per chunk: bounds memory to a few hundred MiB per array
CHUNK_ELEMENTS = 1 << 25

CSV_COLUMNS = ["panel", "mechanism", "epsilon", "delta", "horizon", "runs", "rate_low",
               "rate_high", "width", "rmse", "rmse_se", "advantage", "advantage_low",
               "advantage_high"]


@dataclass(frozen=True)
class Setup:
    """One experimental setting (the stream distribution and the privacy target)."""

    horizon: int = 10_000
    runs: int = 20_000
    delta: float = DELTA
    low: float = 0.1
    high: float = 0.9
    width: int = 10
    seed: int = 0
    panel: str = ""
    #: bounded counter inside every CC/BCC: "sqrt" (the paper's) or "tree" (the core's
    #: default inside ECC and SimECC)
    base: str = "sqrt"
    #: ECC's and SimECC's constants: "paper" or "tight" (processor.core.tight)
    calibration: str = "paper"

    def rates(self) -> FloatArray:
        return attack.block_rates(self.horizon, self.low, self.high, self.width)


@dataclass
class Point:
    """The result of one (mechanism, eps) point of a sweep."""

    panel: str
    mechanism: str
    epsilon: float
    delta: float
    horizon: int
    runs: int
    rate_low: float
    rate_high: float
    width: int
    rmse: float
    rmse_se: float
    advantage: float = math.nan
    advantage_low: float = math.nan
    advantage_high: float = math.nan
    stats: FloatArray | None = field(default=None, repr=False)
    bits: npt.NDArray[np.bool_] | None = field(default=None, repr=False)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("stats")
        d.pop("bits")
        return d


def _chunks(runs: int, horizon: int) -> list[int]:
    """Chunk sizes: about CHUNK_ELEMENTS per array, but at least 128 runs (or all of them)
    so the per-tick loops of long horizons run over enough runs to amortise Python."""
    size = max(min(runs, 128), min(runs, CHUNK_ELEMENTS // max(1, horizon)))
    out = [size] * (runs // size)
    if runs % size:
        out.append(runs % size)
    return out


def _stream_rng(seed: int, chunk: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, 0, chunk]))


@lru_cache(maxsize=16)
def _trials(setup: Setup, chunk: int, size: int) -> tuple[npt.NDArray[np.int8],
                                                          npt.NDArray[np.bool_]]:
    """The trials of one chunk: a pure function of (setup's stream fields, seed, chunk),
    cached because every mechanism and eps of a sweep reuses them (common random
    numbers); read-only so nothing downstream can alter them."""
    x, b = attack.draw_trials(setup.rates(), size, _stream_rng(setup.seed, chunk))
    x.setflags(write=False)
    b.setflags(write=False)
    return x, b


def _noise_rng(seed: int, mechanism: str, eps: float, chunk: int) -> np.random.Generator:
    tag = [ord(ch) for ch in mechanism]
    return np.random.default_rng(
        np.random.SeedSequence([seed, 1, *tag, round(eps * 1e6), chunk]))


def _stream_key(setup: Setup) -> Setup:
    """The setup with the fields that do not affect the streams normalised (cache key)."""
    return replace(setup, delta=DELTA, panel="", base="sqrt", calibration="paper")


def run_point(setup: Setup, mechanism: str, eps: float, *, attack_on: bool = True,
              keep_stats: bool = False, progress: Any = None) -> Point:
    """Run `setup.runs` trials of one mechanism at one eps; per-run RMSE and advantage."""
    rates = setup.rates()
    theta = attack.threshold(rates)
    rmses: list[FloatArray] = []
    stats: list[FloatArray] = []
    bits: list[npt.NDArray[np.bool_]] = []
    correct = 0
    for i, size in enumerate(_chunks(setup.runs, setup.horizon)):
        x, b = _trials(_stream_key(setup), i, size)
        y = simulate(mechanism, x, eps, setup.delta, _noise_rng(setup.seed, mechanism, eps, i),
                     setup.base, setup.calibration)
        if attack_on:
            st = attack.statistic(y, rates)
            correct += int(np.sum((st >= theta) == b))
            if keep_stats:
                stats.append(st)
                bits.append(b)
        y -= np.cumsum(x, axis=1, dtype=np.int32)  # in place: y is ours, now the error
        rmses.append(np.sqrt(np.einsum("ij,ij->i", y, y) / setup.horizon))
        del y
        if progress is not None:
            progress.update(size)
    rm, se = attack.mean_se(np.concatenate(rmses))
    pt = Point(setup.panel, mechanism, eps, setup.delta, setup.horizon, setup.runs, setup.low,
               setup.high, setup.width, rm, se)
    if attack_on:
        adv = attack.advantage(correct, setup.runs)
        pt.advantage, pt.advantage_low, pt.advantage_high = adv.value, adv.low, adv.high
    if keep_stats:
        pt.stats = np.concatenate(stats)
        pt.bits = np.concatenate(bits)
    return pt


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, leave=False,
                dynamic_ncols=True)


#: mechanisms whose noise is input-independent and additive with eps entering only as a
#: scale: a sweep draws their standardised noise once per chunk and rescales it per eps
ADDITIVE = ("basecc", "gaussiancc")


def additive_sweep(setup: Setup, mechanism: str, eps_values: Sequence[float],
                   progress: Any = None) -> list[Point]:
    """Every eps point of BaseCC or GaussianCC from one noise draw per chunk.

    Exact, not an approximation: their release is y = s + e with e a fixed linear map of
    standard normals whose scales alone depend on eps (BaseCC: a * A[K(t)] + b_k(t) * Q_t,
    see simulate.CCParts; GaussianCC: sigma_t z_t), and both the attack statistic
    (S = c - y.w) and the per-run mean square error are sums over ticks that reduce to a few
    per-run sums of the standardised noise. Each point has exactly the law of
    `run_point`; the points of one sweep share their noise (common random numbers across
    eps, as across mechanisms for the streams), which only correlates neighbouring
    points' estimation errors.
    """
    if mechanism not in ADDITIVE:
        raise ValueError(f"{mechanism} is not an additive-noise mechanism")
    rates = setup.rates()
    c, w = attack.weights(rates)
    theta = attack.threshold(rates)
    horizon = setup.horizon
    n_eps = len(eps_values)
    sq_err: list[list[FloatArray]] = [[] for _ in eps_values]
    correct = np.zeros(n_eps, dtype=np.int64)
    if mechanism == "basecc":
        scales = [cc_scales(e, setup.delta, horizon, setup.base) for e in eps_values]
    else:
        sigmas = [gaussiancc_sigma_vector(e, setup.delta, horizon) for e in eps_values]
    for i, size in enumerate(_chunks(setup.runs, horizon)):
        x, b = _trials(_stream_key(setup), i, size)
        sw = np.cumsum(x, axis=1, dtype=np.float64) @ w
        rng = _noise_rng(setup.seed, mechanism, 0.0, i)  # 0.0: shared by every eps
        if mechanism == "basecc":
            parts = cc_parts(size, horizon, rng, setup.base)
            a_mat = parts.A
            levels = a_mat.shape[1] - 1
            completed = parts.completed
            a2 = (a_mat * a_mat) @ np.bincount(completed, minlength=levels + 1)
            aw = a_mat @ np.bincount(completed, weights=w, minlength=levels + 1)
            starts = np.array([(1 << k) - 1 for k in range(levels) if (1 << k) <= horizon])
            q = parts.Q.astype(np.float64)
            sq = np.add.reduceat(q, starts, axis=1)  # per interval: sum of Q
            qw = np.add.reduceat(q * w[None, :], starts, axis=1)
            q *= q
            qq = np.add.reduceat(q, starts, axis=1)
            del q, parts
            k_used = starts.size
            for j, (a, bv) in enumerate(scales):
                bk = bv[:k_used]
                ms = a * a * a2 + 2 * a * ((a_mat[:, :k_used] * sq) @ bk) + qq @ (bk * bk)
                sq_err[j].append(ms / horizon)
                st = c - sw - a * aw - qw @ bk
                correct[j] += int(np.sum((st >= theta) == b))
                if progress is not None:
                    progress.update(size)
        else:
            z = rng.standard_normal((size, horizon), dtype=np.float32).astype(np.float64)
            for j, sig in enumerate(sigmas):
                st = c - sw - z @ (w * sig)
                correct[j] += int(np.sum((st >= theta) == b))
                if progress is not None:
                    progress.update(size)
            z *= z
            for j, sig in enumerate(sigmas):
                sq_err[j].append((z @ (sig * sig)) / horizon)
            del z
    out = []
    for j, eps in enumerate(eps_values):
        rm, se = attack.mean_se(np.sqrt(np.concatenate(sq_err[j])))
        adv = attack.advantage(int(correct[j]), setup.runs)
        out.append(Point(setup.panel, mechanism, float(eps), setup.delta, horizon, setup.runs,
                         setup.low, setup.high, setup.width, rm, se, adv.value, adv.low,
                         adv.high))
    return out


def _task(setup: Setup, mechanism: str, eps_values: tuple[float, ...]) -> list[Point]:
    """One unit of work of a sweep (runs in a worker process when jobs > 1)."""
    if mechanism in ADDITIVE:
        return additive_sweep(setup, mechanism, eps_values)
    return [run_point(setup, mechanism, eps) for eps in eps_values]


def sweep(setup: Setup, mechanisms: Sequence[str], eps_values: Sequence[float],
          progress: bool = True, jobs: int = 1) -> list[Point]:
    """Every (mechanism, eps) point of the setting, in (mechanism, eps) order.

    jobs > 1 spreads the points over that many worker processes. The numbers do not
    depend on it: every point's noise comes from its own (seed, mechanism, eps, chunk)
    generator and the streams from (seed, chunk).
    """
    tasks: list[tuple[str, tuple[float, ...]]] = []
    for m in mechanisms:
        if m in ADDITIVE:
            tasks.append((m, tuple(eps_values)))
        else:
            tasks.extend((m, (e,)) for e in eps_values)
    results: dict[int, list[Point]] = {}
    with progress_bar(setup.runs * len(mechanisms) * len(eps_values), setup.panel or "sweep",
              progress) as bar:
        if jobs <= 1:
            for i, (m, es) in enumerate(tasks):
                results[i] = _task(setup, m, es)
                bar.update(setup.runs * len(es))
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            from processor.commandline import pool_worker_signals

            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx,
                                     initializer=pool_worker_signals) as pool:
                futs = {pool.submit(_task, setup, m, es): i for i, (m, es) in enumerate(tasks)}
                for fut in as_completed(futs):
                    i = futs[fut]
                    results[i] = fut.result()
                    bar.update(setup.runs * len(tasks[i][1]))
    return [p for i in range(len(tasks)) for p in results[i]]


# --------------------------------------------------------------------------- files


def write_csv(path: Path, points: Iterable[Point], columns: Sequence[str] = CSV_COLUMNS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for p in points:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                        for k, v in p.row().items()})


def read_csv(path: Path) -> list[Point]:
    out: list[Point] = []
    with path.open() as fh:
        for r in csv.DictReader(fh):
            out.append(Point(r.get("panel", ""), r["mechanism"], float(r["epsilon"]),
                             float(r["delta"]), int(r["horizon"]), int(r["runs"]),
                             float(r.get("rate_low") or "nan"), float(r.get("rate_high") or "nan"),
                             int(r.get("width") or 0), float(r["rmse"]), float(r["rmse_se"]),
                             float(r.get("advantage") or "nan"),
                             float(r.get("advantage_low") or "nan"),
                             float(r.get("advantage_high") or "nan")))
    return out


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_tradeoff(ax: Any, points: Sequence[Point], title: str) -> None:
    """Advantage against per-run RMSE, one line per mechanism, the paper's error bars
    (SE on RMSE, 95% Clopper-Pearson on the advantage)."""
    for m in dict.fromkeys(p.mechanism for p in points):
        ps = sorted((p for p in points if p.mechanism == m), key=lambda p: p.epsilon)
        xs = np.array([p.rmse for p in ps])
        ys = np.array([p.advantage for p in ps])
        yerr = np.array([[p.advantage - p.advantage_low for p in ps],
                         [p.advantage_high - p.advantage for p in ps]])
        ax.errorbar(xs, ys, xerr=[p.rmse_se for p in ps], yerr=yerr, marker="o", ms=3,
                    capsize=2, label=LABELS.get(m, m))
    ax.set_xscale("log")
    ax.set_xlabel("Per-run RMSE")
    ax.set_ylabel("Advantage")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)


def save_fig1a(points: Sequence[Point], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    plot_tradeoff(ax, points, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_fig1b(points: Sequence[Point], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for m in dict.fromkeys(p.mechanism for p in points):
        ps = sorted((p for p in points if p.mechanism == m), key=lambda p: p.horizon)
        ax.errorbar([p.horizon for p in ps], [p.rmse for p in ps],
                    yerr=[p.rmse_se for p in ps], marker="o", ms=3, capsize=2,
                    label=LABELS.get(m, m))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T")
    ax.set_ylabel("Per-run RMSE")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    eps = points[0].epsilon if points else float("nan")
    ax.set_title(f"eps = {eps:g}, delta = {points[0].delta:g}, rate 0.01, "
                 f"N = {points[0].runs}" if points else "", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_fig3(points: Sequence[Point], path: Path, titles: dict[str, str]) -> None:
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (panel, title) in zip(axes.ravel(), titles.items(), strict=False):
        plot_tradeoff(ax, [p for p in points if p.panel == panel], title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass(frozen=True)
class Histogram:
    """Normalised histograms of S under H0 (b = 0) and H1 (b = 1) for one point."""

    mechanism: str
    epsilon: float
    edges: FloatArray
    density0: FloatArray
    density1: FloatArray
    mean0: float
    mean1: float
    theta: float
    advantage: float


def histogram(point: Point, theta: float, bins: int = 60) -> Histogram:
    if point.stats is None or point.bits is None:
        raise ValueError("the point was run without keep_stats")
    st, b = point.stats, point.bits
    lo, hi = np.percentile(st, [0.1, 99.9])
    lo, hi = min(lo, theta), max(hi, theta)
    edges = np.linspace(lo, hi, bins + 1)
    d0, _ = np.histogram(st[~b], bins=edges, density=True)
    d1, _ = np.histogram(st[b], bins=edges, density=True)
    return Histogram(point.mechanism, point.epsilon, edges, d0.astype(np.float64),
                     d1.astype(np.float64), float(st[~b].mean()), float(st[b].mean()), theta,
                     point.advantage)


def save_fig2(hists: Sequence[Histogram], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(hists), figsize=(4.2 * len(hists), 3.4))
    for ax, h in zip(np.atleast_1d(axes), hists, strict=True):
        w = np.diff(h.edges)
        ax.bar(h.edges[:-1], h.density0, width=w, align="edge", alpha=0.45, color="tab:blue",
               hatch="\\\\", label="H0 (b = 0)")
        ax.bar(h.edges[:-1], h.density1, width=w, align="edge", alpha=0.45, color="tab:red",
               hatch="//", label="H1 (b = 1)")
        ax.axvline(h.theta, color="k", ls="--", lw=1.6, label="theta")
        ax.axvline(h.mean0, color="tab:blue", ls="--", lw=0.8)
        ax.axvline(h.mean1, color="tab:red", ls="--", lw=0.8)
        ax.set_xlabel("S")
        ax.set_ylabel("density")
        ax.set_title(f"{LABELS.get(h.mechanism, h.mechanism)} at eps = {h.epsilon:.3g}\n"
                     f"Adv = {h.advantage:+.3f}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_hist_csv(path: Path, hists: Sequence[Histogram]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["mechanism", "epsilon", "hypothesis", "bin_left", "bin_right", "density",
                    "mean", "theta", "advantage"])
        for h in hists:
            for hyp, dens, mean in (("H0", h.density0, h.mean0), ("H1", h.density1, h.mean1)):
                for i, d in enumerate(dens):
                    w.writerow([h.mechanism, f"{h.epsilon:.6g}", hyp, f"{h.edges[i]:.6g}",
                                f"{h.edges[i + 1]:.6g}", f"{d:.6g}", f"{mean:.6g}",
                                f"{h.theta:.6g}", f"{h.advantage:.6g}"])


# --------------------------------------------------------------------------- Table 1


@dataclass(frozen=True)
class TableEntry:
    """The per-run RMSE attainable at an advantage bound, read off a sweep."""

    mechanism: str
    bound: float
    rmse: float | None
    rmse_se: float | None
    epsilon: float | None


def table1(points: Sequence[Point], bounds: Sequence[float] = (0.1, 0.05)) -> list[TableEntry]:
    """For each mechanism and bound: the smallest per-run RMSE over the sweep points whose
    95% Clopper-Pearson upper limit on the advantage is at most the bound (so the bound
    holds with 95% confidence at that point). None when no point qualifies."""
    out: list[TableEntry] = []
    for m in dict.fromkeys(p.mechanism for p in points):
        for bound in bounds:
            ok = [p for p in points if p.mechanism == m and p.advantage_high <= bound]
            best = min(ok, key=lambda p: p.rmse) if ok else None
            out.append(TableEntry(m, bound, best.rmse if best else None,
                                  best.rmse_se if best else None,
                                  best.epsilon if best else None))
    return out


def format_table1(entries: Sequence[TableEntry],
                  marked: Collection[tuple[str, float]] = ()) -> str:
    """The table; entries whose (mechanism, bound) is in `marked` get a trailing *."""
    bounds = list(dict.fromkeys(e.bound for e in entries))
    head = "| Mechanism | " + " | ".join(f"RMSE @ Adv <= {b:g} (eps)" for b in bounds) + " |"
    lines = [head, "|" + "---|" * (len(bounds) + 1)]
    for m in dict.fromkeys(e.mechanism for e in entries):
        cells = []
        for b in bounds:
            e = next(e for e in entries if e.mechanism == m and e.bound == b)
            cell = ("none in sweep" if e.rmse is None else
                    f"{e.rmse:.2f} ± {e.rmse_se:.2f} (eps {e.epsilon:.3g})")
            cells.append(cell + (" *" if (m, b) in marked else ""))
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- Table 1: boundaries

#: mechanisms whose attack advantage is computed exactly (their noise is Gaussian and
#: independent of the input: exact.advantage_given_sd)
EXACT_MECHANISMS = ("basecc", "gaussiancc")
#: a pass probability inside this range means a repeat of the experiment could read the
#: table differently at that point
BOUNDARY_RANGE = (0.05, 0.95)


def exact_advantage(point: Point, base: str = "sqrt") -> float | None:
    """The exact attack advantage at this point, where it is computable, else None.
    `base` is BaseCC's inner counter (the CSV does not record it; the sweep's --base)."""
    if point.mechanism not in EXACT_MECHANISMS:
        return None
    rates = attack.block_rates(point.horizon, point.rate_low, point.rate_high, point.width)
    if point.mechanism == "basecc":
        sd = exact.basecc_noise_sd(point.epsilon, point.delta, rates, base)
        return exact.advantage_given_sd(rates, sd)
    sig = gaussiancc_sigma_vector(point.epsilon, point.delta, point.horizon)
    return exact.gaussian_advantage(rates, sig)


@dataclass(frozen=True)
class Boundary:
    """How firmly one Table 1 entry is read off.

    `chosen` is the point the entry comes from, `runner_up` the point with the next lower
    RMSE (which failed the bound; with no entry, the point of largest RMSE). Each pass
    range is the probability that a repeat of the same experiment (same runs) puts that
    point's Clopper-Pearson upper limit at or below the bound: at the exact advantage
    where it is known (a single value), else from the two ends of the point's 95% interval
    (a plug-in range, not a probability statement about the mechanism).
    """

    mechanism: str
    bound: float
    chosen: Point | None
    chosen_pass: tuple[float, float] | None
    runner_up: Point | None
    runner_up_pass: tuple[float, float] | None
    exact: bool

    @property
    def at_boundary(self) -> bool:
        lo, hi = BOUNDARY_RANGE
        ranges = [r for r in (self.chosen_pass, self.runner_up_pass) if r is not None]
        return any(r[0] < hi and r[1] > lo for r in ranges)


def _pass_range(point: Point, bound: float, exact_adv: float | None) -> tuple[float, float]:
    if exact_adv is not None:
        v = exact.pass_probability(exact_adv, point.runs, bound)
        return v, v
    lo = exact.pass_probability(min(max(point.advantage_high, -1.0), 1.0), point.runs, bound)
    hi = exact.pass_probability(min(max(point.advantage_low, -1.0), 1.0), point.runs, bound)
    return lo, hi


def boundaries(points: Sequence[Point], bounds: Sequence[float] = (0.1, 0.05),
               base: str = "sqrt") -> list[Boundary]:
    """A Boundary for every Table 1 entry (same read-off rule as table1)."""
    exact_cache: dict[int, float | None] = {}

    def ex(p: Point) -> float | None:
        if id(p) not in exact_cache:
            exact_cache[id(p)] = exact_advantage(p, base)
        return exact_cache[id(p)]

    out: list[Boundary] = []
    for m in dict.fromkeys(p.mechanism for p in points):
        mine = [p for p in points if p.mechanism == m]
        for bound in bounds:
            ok = [p for p in mine if p.advantage_high <= bound]
            chosen = min(ok, key=lambda p: p.rmse) if ok else None
            lower = [p for p in mine if chosen is None or p.rmse < chosen.rmse]
            runner = (max(lower, key=lambda p: p.rmse) if lower else None)
            is_exact = m in EXACT_MECHANISMS
            out.append(Boundary(
                m, bound, chosen,
                _pass_range(chosen, bound, ex(chosen)) if chosen else None,
                runner, _pass_range(runner, bound, ex(runner)) if runner else None,
                is_exact))
    return out


def _fmt_range(r: tuple[float, float] | None) -> str:
    if r is None:
        return "-"
    return f"{r[0]:.2f}" if r[0] == r[1] else f"{r[0]:.2f}-{r[1]:.2f}"


def format_boundaries(items: Sequence[Boundary]) -> str:
    lines = ["| Mechanism | Bound | Entry from eps | P[repeat passes] | Next point eps "
             "| P[repeat passes] | At a boundary |", "|---|---|---|---|---|---|---|"]
    for b in items:
        how = "exact" if b.exact else "over the 95% CI"
        lines.append(
            f"| {LABELS.get(b.mechanism, b.mechanism)} | {b.bound:g} "
            f"| {f'{b.chosen.epsilon:.3g}' if b.chosen else 'none'} | {_fmt_range(b.chosen_pass)} "
            f"| {f'{b.runner_up.epsilon:.3g}' if b.runner_up else '-'} "
            f"| {_fmt_range(b.runner_up_pass)} "
            f"| {'yes' if b.at_boundary else 'no'} ({how}) |")
    return "\n".join(lines)


def format_exact(points: Sequence[Point], bounds: Sequence[float] = (0.1, 0.05),
                 base: str = "sqrt") -> str:
    """The Clopper-Pearson reading beside the exact advantage, for every point where the
    exact advantage is computable, with the chance a repeat passes each bound."""
    head = ("| Mechanism | eps | RMSE | Advantage, 95% CP (runs) | Exact advantage | "
            + " | ".join(f"P[CP upper <= {b:g}]" for b in bounds) + " |")
    lines = [head, "|" + "---|" * (5 + len(bounds))]
    for p in points:
        ex = exact_advantage(p, base)
        if ex is None:
            continue
        probs = " | ".join(f"{exact.pass_probability(ex, p.runs, b):.3f}" for b in bounds)
        lines.append(f"| {LABELS.get(p.mechanism, p.mechanism)} | {p.epsilon:.3g} "
                     f"| {p.rmse:.2f} | {p.advantage:.4f} [{p.advantage_low:.4f}, "
                     f"{p.advantage_high:.4f}] ({p.runs}) | {ex:.4f} | {probs} |")
    return "\n".join(lines)


def table1_report(points: Sequence[Point], bounds: Sequence[float] = (0.1, 0.05),
                  base: str = "sqrt") -> str:
    """Table 1 (entries at a boundary marked), the exact advantages and the boundary table:
    what `table1` prints and writes to table1.md."""
    items = boundaries(points, bounds, base)
    marked = {(b.mechanism, b.bound) for b in items if b.at_boundary}
    return (format_table1(table1(points, bounds), marked)
            + "\n\n(*: at a boundary, see below.)\n\n"
            + format_exact(points, bounds, base) + "\n\n" + format_boundaries(items))


def known_mechanisms(names: Iterable[str]) -> list[str]:
    out = list(names)
    bad = [n for n in out if n not in MECHANISMS]
    if bad:
        raise ValueError(f"unknown mechanism(s) {bad}; known: {', '.join(MECHANISMS)}")
    return out
