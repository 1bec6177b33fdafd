"""`python -m processor audit`: a privacy audit of a mechanism on edit neighbours.

Runs the mechanism many times (independently keyed, reproducible from --seed) on a stream x
(--events events of --pattern, then --gap empty ticks) and on its insertion neighbour x' (a 1
queued at tick --at: every event from there shifts one tick later until the first empty tick
absorbs the shift); by default the pair is searched among every pattern and three insertion
ticks for the one the mechanism's attack separates best (exactly where the law is known, on
a pilot keyed apart otherwise). Each run's releases are reduced to one score (--feature)
and judged (processor.audit): an assumption-free Clopper-Pearson bound; for known
laws a known-null bound and an exact-pair bound (the claimed law's privacy profile on the
pair), with a Kolmogorov-Smirnov check of that law; for ECC and SimECC, under either
calibration, the plan check (exact: the guarantee the counter's parameters and noise scales
deliver, recomputed independently of the planner), a law check of the partition over the
whole run and a law check of CC's and BCC's noise, which no bound on their releases can
replace; in per-unit mode the unit derivation check (exact, the audit's own accounting).
The audit FAILS (exit 1) when a bound exceeds --epsilon or a check fails, and names what
caught it; false-alarm rate at most --alpha (+ 0.001 per law check) for a correct
mechanism. Exit 2: the audit could not run (for example the score is constant: nothing
was released in the window; lengthen the stream).
Defaults per mechanism (pattern, events, gap, feature): """

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from processor.audit.diagnostics import (
    LAW_PARTS,
    ecc_partition_check,
    gaussian_counters_check,
    plan_check,
    simecc_partition_check,
)
from processor.audit.open_keys import CONTROLS
from processor.audit.plans import (
    DEFAULTS,
    FEATURES,
    PATTERNS,
    PairChoice,
    Plan,
    default_streams,
    make_streams,
    pair_objective,
    plan_for,
    search_pair,
)
from processor.audit.runs import core_releases, unit_neighbour
from processor.audit.statistics import AuditError, AuditResult, FloatArray, Stream, judge
from processor.audit.unit_accounting import unit_derivation_check
from processor.commandline import CommandParser
from processor.commands.audit_open_keys import main_open_keys
from processor.core import registry
from processor.core.api import Counter
from processor.core.errors import CoreError
from processor.core.rng import NoiseKey
from processor.core.tight import CALIBRATIONS
from processor.core.unit import METHOD_COUPLED, UnitParameters, derive
from processor.errors import EXIT_ERROR, print_error

Releases = Callable[[Stream, int, str], FloatArray]


def core_backend(mechanism: str, eps: float, delta: float, seed: int,
                 params: dict[str, Any]) -> Releases:
    """Releases of the core counters (the implementation that runs in the stream)."""
    key = NoiseKey.from_seed(seed)

    def factory(counter_id: str) -> Counter:
        return registry.make(mechanism, eps, delta, key, counter_id, **params)

    def run(xs: Stream, runs: int, label: str) -> FloatArray:
        return core_releases(factory, xs, runs, f"audit/{mechanism}/{label}")

    return run


def sim_backend(mechanism: str, eps: float, delta: float, seed: int,
                params: dict[str, Any]) -> Releases:
    """Releases of the vectorised simulator (processor.simulator.simulate, tree base as
    in the core): the same laws, much faster; ⊥ is fed as 0 (same law for these counters).
    PartitionCC runs at the simulator's horizon T = the stream length."""
    from processor.simulator.simulate import MECHANISMS, simulate

    if mechanism not in MECHANISMS:
        raise AuditError(f"the simulator has no {mechanism!r}; known: {', '.join(MECHANISMS)}")
    calibration = str(params.get("calibration", "paper"))
    if set(params) - {"calibration"}:
        raise AuditError("the simulator backend takes no mechanism parameters but "
                         "--calibration")
    rng = np.random.default_rng(seed)

    def run(xs: Stream, runs: int, label: str) -> FloatArray:
        row = np.array([0 if v is None else int(v) for v in xs], dtype=np.int8)
        if np.any(row != np.array([0.0 if v is None else v for v in xs])):
            raise AuditError("the simulator takes values in {0, 1} only")
        return simulate(mechanism, np.tile(row, (runs, 1)), eps, delta, rng, base="tree",
                        calibration=calibration)

    return run


#: releases held in memory at once (runs x ticks); longer audits run in chunks of runs
CHUNK_CELLS = 20_000_000
#: ticks the core backend steps (both streams, every run) above which the command says,
#: before it starts, that it will take minutes: ECC steps about 1.3 us a tick on a 2-core
#: machine, the slower mechanisms up to ~40 us
LONG_CORE_TICKS = 50_000_000


def scores(releases: Releases, plan: Plan, xs: Stream, runs: int, label: str
           ) -> tuple[FloatArray, FloatArray | None]:
    """The scores of `runs` runs on xs, computed chunk by chunk (distinct labels per chunk,
    so every run is independently keyed), and the plan's shift per run (None if none)."""
    chunk = max(1, min(runs, CHUNK_CELLS // max(1, len(xs))))
    parts, shifts = [], []
    for i in range(0, runs, chunk):
        y = releases(xs, min(chunk, runs - i), f"{label}/{i}")
        parts.append(plan.score(y))
        if plan.shift is not None:
            shifts.append(plan.shift(y))
    z = np.concatenate(parts) if parts else np.zeros(0)
    return z, (np.concatenate(shifts) if shifts else None)


def run_audit(releases: Releases, plan: Plan, runs: int, *, eps: float, delta: float,
              alpha: float) -> AuditResult:
    """Score `runs` runs on each stream and judge them."""
    s0, _ = scores(releases, plan, plan.x0, runs, "x")
    s1, m1 = scores(releases, plan, plan.x1, runs, "x'")
    return judge(s0, s1, eps=eps, delta=delta, alpha=alpha, known_null=plan.known_null,
                 m1=m1, pair_law=plan.pair_law)


def report(res: AuditResult, args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """The machine-readable verdict (--json)."""
    def num(v: float) -> float | str:
        return v if math.isfinite(v) else ("-inf" if v < 0 else "inf")

    return {
        "mechanism": args.mechanism, "epsilon": args.epsilon, "delta": args.delta,
        "backend": args.backend, "calibration": args.calibration or "paper",
        "runs_per_stream": args.runs, "pattern": args.pattern,
        "events": args.events, "gap": args.gap, "feature": plan.feature, "seed": args.seed,
        "alpha": args.alpha, "passed": res.passed, "eps_lower_bound": num(res.eps_lb),
        "attainable_empirical_bound": num(res.attainable),
        "null_law_p": res.null_law_p, "null_law_alpha": res.law_alpha,
        "bounds": [{
            "method": b.method, "eps_lower_bound": num(b.eps_lb), "event": b.event,
            "threshold": num(b.threshold), "order": b.order, "p_low": b.p_low,
            "p_high": b.p_high, "runs_selection": b.n_select, "runs_estimation": b.n_estimate,
        } for b in res.bounds],
    }


def _parser() -> argparse.ArgumentParser:
    fixed = "; ".join(f"{m}: {p}, {e}, {g}, {f}"
                      for m, (p, e, g, f) in sorted(DEFAULTS.items()) if e)
    doc = (f"{__doc__ or ''}{fixed}; basecc, partitioncc: alternating, lr, with enough "
           "events for the queue shift to show at this eps (capped: 20,000 and 150,000); ecc: "
           "alternating, first, with enough events for its partition to fire and a gap for "
           "the BCC delay; simecc: empty, values, eight blocks and the delay (all sized from "
           "--epsilon, --delta). Runs: 400 per stream for the lr feature, else 2000.")
    p = CommandParser(prog="python -m processor audit", description=doc,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mechanism", required=True, choices=registry.names(),
                   help="the registered mechanism to audit")
    p.add_argument("--epsilon", type=float, help="the configured epsilon (per event)")
    p.add_argument("--delta", type=float, help="the configured delta (per event)")
    unit = p.add_argument_group(
        "per-unit mode (privacy_unit = user, docs/privacy-unit.md): the pair is x and x "
        "with k events of one unit inserted at --at; the claim is the unit's share of one "
        "counter: (unit eps / m, unit delta / m) under basic composition, what one counter "
        "gives the unit under the k-edit coupling; --epsilon/--delta default to the "
        "parameters derived from the target, and the unit derivation check (exact) fails "
        "the audit when they do not deliver it")
    unit.add_argument("--unit-epsilon", type=float, help="the target epsilon per unit")
    unit.add_argument("--unit-delta", type=float, help="the target delta per unit")
    unit.add_argument("--max-events-per-counter", type=int, help="k")
    unit.add_argument("--max-counters-per-unit", type=int, default=1, help="m (default 1)")
    p.add_argument("--runs", type=int, default=None,
                   help="runs per stream (default 400 with --feature lr, else 2000); half "
                   "select, half estimate; the "
                   "assumption-free bound can never exceed about ln(runs/2 / ln(4/alpha))")
    p.add_argument("--pattern", choices=PATTERNS, default=None,
                   help="events before the gap: alternating 1,0,1,0 | ones | empty (no event: "
                   "x' is one event at tick 1); default per mechanism")
    p.add_argument("--events", type=int, default=None,
                   help="ticks of the pattern before the gap (default per mechanism)")
    p.add_argument("--at", type=int, default=None,
                   help="the insertion tick of the neighbour (default 1); giving --pattern "
                   "or --at fixes the pair (no search)")
    p.add_argument("--search", action=argparse.BooleanOptionalAction, default=None,
                   help="search the candidate pairs (every pattern; insertion at tick 1, 2 "
                   "or a third of the way in) for the one the attack separates best: "
                   "exactly where the law is known, else on a pilot keyed apart from the "
                   "audit (simulator where it has the mechanism); default on unless "
                   "--pattern or --at is given")
    p.add_argument("--gap", type=int, default=None,
                   help="empty ticks after them, >= 1 (default per mechanism)")
    p.add_argument("--feature", choices=FEATURES, default=None,
                   help="the score of a run: lr (likelihood ratio under the claimed Gaussian "
                   "law: gaussiancc, basecc, partitioncc) | increments (the Section 8 linear "
                   "attack) | matched (sum_t y_t d_t over the whole release stream) | final "
                   "(y_T) | first (tick of the first release); default per mechanism")
    p.add_argument("--horizon", type=int, default=None,
                   help="partitioncc's horizon parameter T (core backend; default 10000)")
    p.add_argument("--calibration", choices=CALIBRATIONS, default=None,
                   help="ecc, simecc: the paper's constants (default) or the "
                   "tight analysis (docs/tight-calibration.md); the plan and partition law "
                   "checks run under both")
    p.add_argument("--backend", choices=("core", "sim"), default="core",
                   help="core: the real counters (default); sim: the vectorised simulator "
                   "of processor.simulator (same laws, tree base, much faster; values in "
                   "{0, 1}; partitioncc at horizon = the stream length)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="false-alarm rate of the verdict for a correct mechanism (default "
                   "0.05; the noise-law check adds 0.001)")
    p.add_argument("--seed", type=int, default=0, help="seed of the public audit key / rng")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON on stdout")
    p.add_argument("--open-keys", action="store_true",
                   help="the open-key audit of the admission gate instead (ecc, simecc; "
                   "processor/commands/audit_open_keys.py, docs/open-keys.md)")
    p.add_argument("--open-keys-control", choices=CONTROLS, default=None,
                   help="with --open-keys: audit a broken gate that must FAIL")
    return p


@dataclass(frozen=True)
class Check:
    """One white-box check beside the bounds: an exact recomputation ("plan") or a law
    test ("partition law", KS at the law level). passed False fails the audit."""

    name: str
    passed: bool
    detail: str
    p_value: float | None = None


def main_audit(argv: Sequence[str]) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.open_keys:
        return main_open_keys(args)
    derived, params = settle_arguments(p, args)
    try:
        outcome = audit(args, params, derived)
    except (AuditError, CoreError, ValueError) as exc:
        print_error(exc)
        return EXIT_ERROR
    if args.json:
        print(orjson.dumps(json_report(outcome), option=orjson.OPT_INDENT_2).decode())
    print_summary(outcome)
    return 0 if outcome.passed else 1


def settle_arguments(p: argparse.ArgumentParser, args: argparse.Namespace
                     ) -> tuple[UnitParameters | None, dict[str, Any]]:
    """Check the options together and fill in the mechanism's defaults (in `args`): the
    per-unit target's derivation (None without one) and the mechanism's parameters."""
    derived = None
    if args.unit_epsilon is not None:
        if args.unit_delta is None or args.max_events_per_counter is None:
            p.error("per-unit mode needs --unit-epsilon, --unit-delta and "
                    "--max-events-per-counter")
        try:
            derived = derive(args.unit_epsilon, args.unit_delta, args.max_events_per_counter,
                             args.max_counters_per_unit, mechanism=args.mechanism,
                             calibration=args.calibration or "paper")
        except CoreError as exc:
            p.error(str(exc))
        if args.epsilon is None and args.delta is None:
            args.epsilon, args.delta = derived.event_epsilon, derived.event_delta
        args.search = False  # the pair is fixed: k insertions at --at
    if args.epsilon is None or args.delta is None:
        p.error("--epsilon and --delta are required (or the per-unit target)")
    pattern, events, gap, feature = default_streams(args.mechanism, args.epsilon, args.delta)
    args.pattern_given = args.pattern
    args.pattern = args.pattern or pattern
    args.events = events if args.events is None else args.events
    args.gap = gap if args.gap is None else args.gap
    args.feature = args.feature or feature
    if args.runs is None:
        args.runs = 400 if args.feature in ("lr", "leaves") else 2000
    if args.runs < 4 or args.events < 0 or args.gap < 1 or not 0 < args.alpha < 1:
        p.error("need --runs >= 4, --events >= 0, --gap >= 1 and 0 < --alpha < 1")
    params: dict[str, Any] = {}
    if args.horizon is not None:
        if args.mechanism != "partitioncc":
            p.error("--horizon applies to partitioncc only")
        params["horizon"] = args.horizon
    if args.calibration is not None:
        if args.mechanism not in ("ecc", "simecc"):
            p.error("--calibration applies to ecc and simecc only")
        params["calibration"] = args.calibration
    if args.search is None:
        args.search = args.pattern_given is None and args.at is None
    args.at = args.at or 1
    return derived, params


@dataclass
class Outcome:
    """One audit's result: the bounds, the white-box checks, the pair it ran on and the
    claim it judged (per counter; under a per-unit target, the unit's divided by m)."""

    args: argparse.Namespace
    plan: Plan
    res: AuditResult
    checks: list[Check]
    derived: UnitParameters | None
    claim_eps: float
    claim_delta: float
    choice: PairChoice | None
    tried: list[PairChoice]

    @property
    def passed(self) -> bool:
        return self.res.passed and all(c.passed for c in self.checks)


def audit(args: argparse.Namespace, params: dict[str, Any],
          derived: UnitParameters | None) -> Outcome:
    """Search the pair (unless fixed), run the mechanism on both streams, judge the scores
    and run the white-box checks."""
    choice: PairChoice | None = None
    tried: list[PairChoice] = []
    if args.search:
        choice, tried = choose_pair(args, params)
        args.pattern, args.at = choice.pattern, choice.at
    x0, x1 = make_streams(args.pattern, args.events, args.gap, args.at)
    claim_eps, claim_delta = args.epsilon, args.delta
    if derived is not None:
        x1 = unit_neighbour(x0, args.at, derived.max_events_per_counter)
        m = derived.max_counters_per_unit
        claim_eps, claim_delta = derived.unit_epsilon / m, derived.unit_delta / m
        if derived.method == METHOD_COUPLED:  # the Gaussian parts do not split by m
            claim_eps, claim_delta = derived.counter_epsilon, derived.counter_delta
    plan = plan_for(args.mechanism, args.epsilon, args.delta, x0, x1, args.feature,
                    **params)
    backend = core_backend if args.backend == "core" else sim_backend
    ticks = 2 * args.runs * len(x0)
    if args.backend == "core" and ticks > LONG_CORE_TICKS:
        # Said before the runs, which print nothing until they end.
        print(f"note: {args.runs} runs of each stream, {len(x0):,} ticks each: "
              f"{ticks:,} ticks on the core backend, which takes minutes; --backend sim "
              f"runs the simulator's same laws much faster (docs/audit.md, 'Cost')",
              file=sys.stderr, flush=True)
    releases = backend(args.mechanism, args.epsilon, args.delta, args.seed, params)
    res = run_audit(releases, plan, args.runs, eps=claim_eps, delta=claim_delta,
                    alpha=args.alpha)
    checks = white_box_checks(args, res.law_alpha)
    if derived is not None:
        coupled = (registry.make(args.mechanism, args.epsilon, args.delta,
                                 NoiseKey.from_seed(args.seed), "unit-check",
                                 calibration=args.calibration or "paper")
                   if args.mechanism in ("ecc", "simecc") else None)
        ok, detail = unit_derivation_check(
            args.epsilon, args.delta, derived.unit_epsilon, derived.unit_delta,
            derived.max_events_per_counter, derived.max_counters_per_unit, coupled)
        checks.append(Check("unit derivation", ok, detail))
    return Outcome(args, plan, res, checks, derived, claim_eps, claim_delta, choice, tried)


def json_report(o: Outcome) -> dict[str, Any]:
    """The --json report: `report`'s bounds with the checks, the verdict and the pair."""
    rep = report(o.res, o.args, o.plan)
    rep.update(passed=o.passed, checks=[
        {"check": c.name, "passed": c.passed, "detail": c.detail, "p": c.p_value}
        for c in o.checks])
    part = [c.p_value for c in o.checks if c.name == "partition law"]
    rep["partition_law_p"] = part[0] if part else None
    rep["caught_by"] = caught_by(o.res, o.checks)
    rep["at"] = o.args.at
    if o.derived is not None:
        rep["unit"] = {**o.derived.as_record(), "claim_epsilon": o.claim_eps,
                       "claim_delta": o.claim_delta}
    rep["pair_search"] = None if o.choice is None else {
        "pattern": o.choice.pattern, "at": o.choice.at, "objective": o.choice.objective,
        "how": o.choice.how, "candidates": [
            {"pattern": c.pattern, "at": c.at, "objective": c.objective, "how": c.how}
            for c in o.tried]}
    return rep


def print_summary(o: Outcome) -> None:
    """The human-readable account on stderr: the pair, each bound and check, the verdict."""
    args, res, checks, derived = o.args, o.res, o.checks, o.derived
    if o.choice is not None:
        print(f"pair search: {len(o.tried)} candidates; best {o.choice.pattern} at tick "
              f"{o.choice.at} ({o.choice.how}: eps >= {o.choice.objective:.3f})",
              file=sys.stderr)
    print(f"pair: {args.pattern}, {args.events} events then {args.gap} empty ticks, and "
          f"its insertion neighbour at tick {args.at}", file=sys.stderr)
    for b in res.bounds:
        print(f"{b.method:>10} bound: eps >= {b.eps_lb:.3f} ({b.event}, c = {b.threshold:.4g}, "
              f"{b.order}, p_low {b.p_low:.4g}, p_high {b.p_high:.4g})", file=sys.stderr)
    if res.null_law_p is not None:
        print(f"noise law (KS of the scores on x against their claimed law): "
              f"p = {res.null_law_p:.3g} ({'ok' if res.null_law_ok else 'REJECTED'} at "
              f"{res.law_alpha})", file=sys.stderr)
    for c in checks:
        print(f"{c.name}: {'ok' if c.passed else 'FAILED'} ({c.detail})", file=sys.stderr)
    if derived is not None:
        how = ("what one counter gives a unit by the k-edit coupling"
               if derived.method == METHOD_COUPLED else "unit target / m")
        print(f"per-unit mode: {derived.max_events_per_counter} events of one unit "
              f"inserted at tick {args.at}; claim per counter: eps {o.claim_eps:.6g}, delta "
              f"{o.claim_delta:.3g} ({how})", file=sys.stderr)
    if res.attainable <= o.claim_eps:
        exact = [b.method for b in res.bounds if b.method != "empirical"] + [
            c.name for c in checks]
        tail = (f"what can fail it here: {', '.join(exact)}" if exact else
                "nothing else applies with this feature: use the mechanism's default "
                "--feature, or more --runs")
        print(f"note: with {args.runs} runs the assumption-free bound cannot exceed "
              f"{res.attainable:.2f} <= eps; {tail}", file=sys.stderr)
    verdict = "PASSED" if o.passed else "FAILED"
    laws = (res.null_law_p is not None) + sum(c.p_value is not None for c in checks)
    rate = f"{args.alpha:g}" + (f" + {laws} x {res.law_alpha:g}" if laws else "")
    by = caught_by(res, checks)
    print(f"audit {verdict}: eps lower bound {res.eps_lb:.3f} vs "
          f"{'claimed eps per counter (unit)' if derived else 'configured eps'} "
          f"{o.claim_eps:g}{f' (caught by: {by})' if by else ''} (false-alarm rate <= "
          f"{rate})", file=sys.stderr)


#: the pilot of the pair search is keyed apart from the audit's runs (seed + this)
PILOT_SEED_OFFSET = 7919


def choose_pair(args: argparse.Namespace, params: dict[str, Any]
                ) -> tuple[PairChoice, list[PairChoice]]:
    """The pair search (processor.audit.plans.search_pair) for this command's mechanism,
    stream length and feature. The pilot, where one is needed, runs on the simulator when
    it has the mechanism (same laws, much faster; PartitionCC at horizon = the stream
    length), else on the core, with another seed than the audit's runs."""
    from processor.simulator.simulate import MECHANISMS as SIMULATED

    seed = args.seed + PILOT_SEED_OFFSET
    sim_params = {k: v for k, v in params.items() if k == "calibration"}
    pilot = (sim_backend(args.mechanism, args.epsilon, args.delta, seed, sim_params)
             if args.mechanism in SIMULATED and set(params) <= {"calibration"}
             else core_backend(args.mechanism, args.epsilon, args.delta, seed, params))
    # a pilot of at most ~4 million ticks per stream and candidate (ECC at small eps runs
    # tens of thousands of ticks)
    n = args.events + args.gap
    runs = {"partitioncc": 8}.get(args.mechanism, min(500 if args.mechanism in SIMULATED
                                                      else 100, max(50, 4_000_000 // n)))
    objective = pair_objective(args.mechanism, args.epsilon, args.delta, args.feature,
                               params, pilot, runs, args.alpha)
    return search_pair(args.events, args.gap, objective)


def caught_by(res: AuditResult, checks: list[Check]) -> str:
    """Which bounds and checks failed the mechanism ("" if none)."""
    out = [f"{b.method} bound" for b in res.bounds if b.eps_lb > res.eps]
    if not res.null_law_ok:
        out.append("noise law")
    out += [c.name for c in checks if not c.passed]
    return ", ".join(out)


def white_box_checks(args: argparse.Namespace, law_alpha: float) -> list[Check]:
    """ECC and SimECC (either calibration, either backend: the checks read fresh core
    counters): the plan check (exact: the guarantee their parameters and noise scales
    deliver, recomputed independently of the planner), the law check of the partition over
    the whole run on LAW_PARTS fresh partitions (ECC: every SVT instance of Part on one
    event per tick, fewer partitions at small eps where the step budget runs out; SimECC:
    every gap of SimPart; at least as many instances or gaps as the audit's stream can
    hold) and the law check of CC's and BCC's noise over min(runs, 400) fresh counters
    against the sigma their (eps, delta) promise. Each law check fails a correct counter
    with probability at most law_alpha. Other mechanisms: none."""
    if args.mechanism not in ("ecc", "simecc"):
        return []
    key = NoiseKey.from_seed(args.seed)
    cal = args.calibration or "paper"

    def fresh(counter_id: str) -> Any:
        return registry.make(args.mechanism, args.epsilon, args.delta, key, counter_id,
                             calibration=cal)

    pc = plan_check(fresh("plan-check"), args.epsilon, args.delta)
    detail = (f"tight plan recomputed: a = {pc.part_loss:.4g}, mu_tot = {pc.mu_total:.4g}, "
              f"delivers delta = {pc.delta_delivered:.4g}" if cal == "tight" else
              "paper plan: partition, CC and BCC at least as private as the paper's "
              "constants, noise scales as Algorithm 1/5 ask")
    checks = [Check("plan", pc.passed, "; ".join(pc.problems) or detail)]
    check = ecc_partition_check if args.mechanism == "ecc" else simecc_partition_check
    law = check(lambda c: fresh(c)._part, args.epsilon, args.delta, LAW_PARTS, args.seed,
                calibration=cal, horizon=args.events + args.gap)
    checks.append(Check("partition law", law.p_value >= law_alpha, law.detail(law_alpha),
                        law.p_value))
    ok, detail, p_cc = gaussian_counters_check(fresh, min(args.runs, 400), law_alpha)
    checks.append(Check("CC/BCC law", ok, detail, p_cc))
    return checks
