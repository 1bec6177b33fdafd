"""`python -m processor audit`: an empirical privacy audit of a mechanism on edit neighbours.

Runs the mechanism many times (independently keyed, reproducible from --seed) on a stream
of `--events` events followed by `--gap` empty ticks, and on its insertion neighbour (one
extra event at tick 1; the queue shift is absorbed by the first empty tick). The distinguishing
test and the Clopper-Pearson lower bound on epsilon are those of processor.core.audit. A lower
bound above the configured epsilon is a failed audit (exit code 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from processor.core import registry
from processor.core.api import Counter
from processor.core.audit import (
    Feature,
    audit,
    bucketed,
    final_value,
    first_release,
    insertion_neighbour,
)
from processor.core.errors import CoreError
from processor.core.rng import NoiseKey


def shift_feature(x0: Sequence[float | None], x1: Sequence[float | None]) -> Feature:
    """The matched filter for the queue shift (the idea of the Section 8 attack): with
    d_t = x1_t - x0_t, guess "x1" iff sum_t dy_t d_t >= (1/2) sum_t d_t^2."""
    d = [(b or 0.0) - (a or 0.0) for a, b in zip(x0, x1, strict=True)]
    half_energy = 0.5 * sum(v * v for v in d)

    def f(tr: list[tuple[int, float]], n: int) -> bool:
        score = 0.0
        prev = 0.0
        for t, y in tr:  # dy is zero except where y changed
            if 1 <= t <= n:
                score += (y - prev) * d[t - 1]
            prev = y
        return score >= half_energy

    return f


def _feature(spec: str) -> Feature:
    if spec == "final":
        return final_value
    if spec == "first":
        return first_release
    if spec.startswith("final-bucket:"):
        return bucketed(final_value, float(spec.split(":", 1)[1]))
    raise argparse.ArgumentTypeError(f"unknown feature {spec!r}")


def main_audit(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m processor audit", description=__doc__)
    p.add_argument("--mechanism", required=True, choices=registry.names())
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--runs", type=int, default=2000, help="runs per stream (default 2000)")
    p.add_argument("--events", type=int, default=400, help="events before the gap (default 400)")
    p.add_argument("--gap", type=int, default=20, help="empty ticks after them (default 20)")
    p.add_argument("--feature", default="shift",
                   help="shift | final | first | final-bucket:W (what the attacker looks at; "
                   "shift is the matched filter for the queue shift)")
    p.add_argument("--pattern", choices=("alternating", "ones"), default="alternating",
                   help="event values before the gap: 1,0,1,0,... (the shift changes every "
                   "tick) or all 1 (default alternating)")
    p.add_argument("--alpha", type=float, default=0.05, help="false-alarm rate (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the public audit key")
    args = p.parse_args(argv)
    if args.runs < 2 or args.events < 0 or args.gap < 1:
        p.error("need --runs >= 2, --events >= 0 and --gap >= 1")
    key = NoiseKey.from_seed(args.seed)

    def factory(counter_id: str) -> Counter:
        return registry.make(args.mechanism, args.epsilon, args.delta, key, counter_id)

    values = [1.0 - (i % 2) if args.pattern == "alternating" else 1.0 for i in range(args.events)]
    x0: list[float | None] = [*values, *([None] * args.gap)]
    x1 = insertion_neighbour(x0, 1)
    try:
        feature = shift_feature(x0, x1) if args.feature == "shift" else _feature(args.feature)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        p.error(str(exc))
    try:
        res = audit(factory, x0, x1, args.runs, eps=args.epsilon, delta=args.delta,
                    feature=feature, alpha=args.alpha, label=f"audit/{args.mechanism}")
    except CoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {
        "mechanism": args.mechanism, "epsilon": args.epsilon, "delta": args.delta,
        "runs_per_stream": args.runs, "feature": args.feature, "event": res.event,
        "direction": res.direction, "eps_lower_bound": res.eps_lb, "p0_low": res.p0_low,
        "p1_high": res.p1_high, "alpha": args.alpha, "passed": res.passed,
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    verdict = "PASSED" if res.passed else "FAILED"
    print(f"audit {verdict}: empirical eps lower bound {res.eps_lb:.3f} "
          f"vs configured eps {args.epsilon} (confidence {1 - args.alpha:.0%})", file=sys.stderr)
    return 0 if res.passed else 1
