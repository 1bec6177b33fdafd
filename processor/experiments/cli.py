"""`python -m processor.experiments fig1a|fig1b|fig2|fig3|table1|bounds [options]`.

Each command writes a CSV and a PNG under --out (default ./experiments-out) and prints a
short summary; a tqdm progress bar goes to stderr. The same seed gives the same numbers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from processor.commandline import CommandParser
from processor.core.cc import DEFAULT_BASE
from processor.core.tight import CALIBRATIONS
from processor.errors import print_error
from processor.experiments import figures as F
from processor.experiments.attack import threshold


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m processor experiment",
                      description="Reproduce the paper's Section 8 experiments.")
    p.add_argument("command", choices=["fig1a", "fig1b", "fig2", "fig3", "table1", "bounds"],
                   help="the figure or table to reproduce")
    p.add_argument("--runs", type=int, default=None,
                   help="runs per point (paper: 20000; fig1b: 100)")
    p.add_argument("--horizon", type=int, nargs="+", default=None,
                   help="T (fig1b: a list; paper: 1e4, fig1b 1e3..1e6, fig3 1e3)")
    p.add_argument("--out", type=Path, default=Path("experiments-out"),
                   help="directory for the CSV and PNG (default: experiments-out)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the public experiment key (same seed, same numbers)")
    p.add_argument("--mechanisms", nargs="+", default=None,
                   help="mechanisms to run (default: the figure's own set)")
    p.add_argument("--epsilon", "--eps", dest="eps", type=float, nargs="+", default=None,
                   help="epsilon values (default: the paper's 12-point sweep 0.1..150; "
                   "--eps is the same option, as the other commands' --epsilon)")
    p.add_argument("--delta", type=float, default=F.DELTA,
                   help=f"delta of every mechanism (default: the paper's {F.DELTA:g})")
    p.add_argument("--csv", type=Path, default=None,
                   help="table1: read an existing fig1a CSV instead of running the sweep")
    p.add_argument("--base", choices=["sqrt", "tree", "blt"], default="sqrt",
                   help="bounded counter inside CC/BCC: sqrt (the paper's), blt (the "
                        "stream's default) or tree (the default before blt)")
    p.add_argument("--calibration", choices=CALIBRATIONS, default="paper",
                   help="ECC's and SimECC's constants: the paper's or the tight analysis "
                        "(docs/tight-calibration.md)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes for the sweeps (results do not depend on it)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr")
    return p


def _say(text: str) -> None:
    print(text, flush=True)


def main_experiment(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 2 bad arguments)."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        return _run(args)
    except ValueError as exc:
        print_error(str(exc))
        return 2


def _run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    eps = tuple(args.eps) if args.eps else F.EPS_SWEEP
    progress = not args.no_progress
    if args.runs is not None and args.runs < 2:
        raise ValueError("--runs must be at least 2")
    start = time.perf_counter()
    cmd = args.command
    points: list[F.Point] = []
    if cmd in ("fig1a", "table1"):
        if cmd == "table1" and args.csv is not None:
            points = F.read_csv(args.csv)
        else:
            setup = F.Setup(horizon=_one(args.horizon, 10_000), runs=args.runs or 20_000,
                            delta=args.delta, seed=args.seed, panel=cmd, base=args.base,
                            calibration=args.calibration)
            mechs = F.known_mechanisms(args.mechanisms or F.FIG1A_MECHANISMS)
            points = F.sweep(setup, mechs, eps, progress, args.jobs)
            F.write_csv(out / f"{cmd}.csv", points)
            if cmd == "fig1a":
                F.save_fig1a(points, out / "fig1a.png",
                             f"T = {setup.horizon}, delta = {setup.delta:g}, rates 0.1/0.9 "
                             f"in blocks of 10, N = {setup.runs}{_variant(setup)}")
        table = F.table1_report(points, base=args.base)
        (out / "table1.md").write_text(table + "\n")
        _say(table)
    elif cmd == "bounds":
        from processor.experiments import bounds as B

        report = B.measure(eps[0] if args.eps else 10.0, args.delta, 0.05, args.runs or 2000,
                           _one(args.horizon, 10_000),
                           args.base if args.base != "sqrt" else DEFAULT_BASE,
                           args.calibration, args.seed)
        B.write(report, out)
        _say(report.summary())
    elif cmd == "fig1b":
        horizons = [int(h) for h in (args.horizon or [1_000, 10_000, 100_000, 1_000_000])]
        mechs = F.known_mechanisms(args.mechanisms or F.FIG1B_MECHANISMS)
        e = eps[0] if args.eps else 10.0
        runs = args.runs or 100
        points = []
        with F.progress_bar(runs * len(mechs) * len(horizons), "fig1b", progress) as bar:
            for h in horizons:
                # constant rate 0.01: low = high, so the attack is meaningless and skipped
                setup = F.Setup(horizon=h, runs=runs, delta=args.delta, low=0.01, high=0.01,
                                width=h, seed=args.seed, panel="fig1b", base=args.base,
                                calibration=args.calibration)
                for m in mechs:
                    points.append(F.run_point(setup, m, e, attack_on=False, progress=bar))
        F.write_csv(out / "fig1b.csv", points)
        F.save_fig1b(points, out / "fig1b.png")
        for p in points:
            _say(f"{F.LABELS[p.mechanism]:12s} T={p.horizon:>8d} rmse={p.rmse:10.2f} "
                 f"± {p.rmse_se:.2f}")
    elif cmd == "fig2":
        setup = F.Setup(horizon=_one(args.horizon, 10_000), runs=args.runs or 20_000,
                        delta=args.delta, seed=args.seed, panel="fig2", base=args.base,
                        calibration=args.calibration)
        # The paper's panels: BaseCC and PartitionCC at the sweep's 6th eps (2.78), SimECC
        # at the largest (150).
        cases = [("basecc", F.EPS_SWEEP[5]), ("partitioncc", F.EPS_SWEEP[5]),
                 ("simecc", F.EPS_SWEEP[-1])]
        theta = threshold(setup.rates())
        hists: list[F.Histogram] = []
        with F.progress_bar(setup.runs * len(cases), "fig2", progress) as bar:
            for m, e in cases:
                pt = F.run_point(setup, m, e, keep_stats=True, progress=bar)
                hists.append(F.histogram(pt, theta))
        F.write_hist_csv(out / "fig2.csv", hists)
        F.save_fig2(hists, out / "fig2.png")
        for hh in hists:
            _say(f"{F.LABELS[hh.mechanism]:12s} eps={hh.epsilon:.3g} mean S|H0={hh.mean0:.1f} "
                 f"mean S|H1={hh.mean1:.1f} theta={hh.theta:.1f} adv={hh.advantage:+.3f}")
    else:  # fig3
        base = F.Setup(horizon=_one(args.horizon, 1_000), runs=args.runs or 20_000,
                       delta=args.delta, seed=args.seed + 1, panel="a",
                       base=args.base, calibration=args.calibration)
        panels = {
            "a": (base, f"(a) T = {base.horizon}, other seed"),
            "b": (_replace(base, width=50, panel="b"), "(b) rate flips every 50 steps"),
            "c": (_replace(base, low=0.3, high=0.7, panel="c"), "(c) rates {0.3, 0.7}"),
            "d": (_replace(base, delta=1e-9, panel="d"), "(d) delta = 1e-9"),
        }
        mechs = F.known_mechanisms(args.mechanisms or F.FIG1A_MECHANISMS)
        points = []
        for setup, _title in panels.values():
            points.extend(F.sweep(setup, mechs, eps, progress, args.jobs))
        F.write_csv(out / "fig3.csv", points)
        F.save_fig3(points, out / "fig3.png", {k: v[1] for k, v in panels.items()})
    _say(f"{cmd}: done in {time.perf_counter() - start:.1f} s; files in {out}")
    return 0


def _variant(setup: F.Setup) -> str:
    """The title suffix of a non-default base or calibration."""
    parts = ([f"base {setup.base}"] if setup.base != "sqrt" else []) + (
        [f"{setup.calibration} calibration"] if setup.calibration != "paper" else [])
    return (", " + ", ".join(parts)) if parts else ""


def _one(values: list[int] | None, default: int) -> int:
    if not values:
        return default
    if len(values) != 1:
        raise ValueError("this command takes one --horizon")
    return int(values[0])


def _replace(setup: F.Setup, **changes: object) -> F.Setup:
    from dataclasses import replace

    return replace(setup, **changes)  # type: ignore[arg-type]
