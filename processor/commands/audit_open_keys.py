"""`python -m processor audit --mechanism ecc|simecc --open-keys`: the open-key audit.

Runs processor/audit/open_keys.py's checks on the admission gate of
processor/core/selection.py (or on a broken control, --open-keys-control) in event mode
(--epsilon, --delta per event; default 10, 1e-6) and in user mode (the --unit-* target,
default 10, 1e-6, k = 32, m = 2, counters at the derived per-event parameters), under each
calibration (both unless --calibration). Each statistical check runs at alpha / (their
number), so the verdict's false-alarm rate is at most --alpha. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from processor.audit.open_keys import (
    Finding,
    Maker,
    Setup,
    audit_open_keys,
    late_count,
    per_tick_gate,
    union_gate,
)
from processor.core.errors import CoreError
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.selection import OpenKey
from processor.core.tight import CALIBRATIONS
from processor.core.unit import derive
from processor.errors import EXIT_ERROR, print_error

#: statistical checks per configuration (time-uniform, whole count, noisy at admission)
_STAT_CHECKS = 3


def _gate(control: str | None, setup: Setup, k1_plan: tuple[float, float]) -> Maker:
    real: Maker = OpenKey.first_seen
    if control == "per-tick":
        return per_tick_gate(setup)
    if control == "ignores-k":
        return union_gate(*k1_plan)
    if control in ("leaves-out", "noiseless"):
        return late_count(real, setup, control == "noiseless")
    return real


def _configs(args: argparse.Namespace) -> list[tuple[str, Setup, tuple[float, float]]]:
    """(mode, setup, the CC plan of counters derived for k = 1) per mode and calibration."""
    mech = args.mechanism
    cals = [args.calibration] if args.calibration else list(CALIBRATIONS)
    modes = ["user"] if args.open_keys_control == "ignores-k" else ["event", "user"]
    n_stat = _STAT_CHECKS * len(cals) * len(modes)
    alpha = args.alpha / n_stat
    plan = ecc_parameters if mech == "ecc" else simecc_parameters
    out = []
    for cal in cals:
        for mode in modes:
            if mode == "event":
                eps = 10.0 if args.epsilon is None else args.epsilon
                delta = 1e-6 if args.delta is None else args.delta
                k1 = plan(eps, delta, cal)
            else:
                ue = 10.0 if args.unit_epsilon is None else args.unit_epsilon
                ud = 1e-6 if args.unit_delta is None else args.unit_delta
                k = args.max_events_per_counter or 32
                m = args.max_counters_per_unit if args.unit_epsilon is not None else 2
                d = derive(ue, ud, k, m, mechanism=mech, calibration=cal)
                eps, delta = d.event_epsilon, d.event_delta
                one = derive(ue, ud, 1, m, mechanism=mech, calibration=cal)
                k1 = plan(one.event_epsilon, one.event_delta, cal)
            setup = Setup(mech, eps, delta, cal, alpha=alpha, seed=args.seed)
            out.append((mode, setup, (k1.cc_eps, k1.cc_delta)))
    return out


def main_open_keys(args: argparse.Namespace) -> int:
    if args.mechanism not in ("ecc", "simecc"):
        print_error("the open-key audit runs ecc or simecc")
        return EXIT_ERROR
    try:
        results: list[tuple[str, Setup, list[Finding]]] = [
            (mode, s, audit_open_keys(_gate(args.open_keys_control, s, k1), s))
            for mode, s, k1 in _configs(args)]
    except (CoreError, ValueError) as exc:
        print_error(exc)
        return EXIT_ERROR
    passed = all(f.passed for _, _, fs in results for f in fs)
    gate = args.open_keys_control or "processor.core.selection"
    if args.json:
        rep: list[dict[str, Any]] = [
            {"mode": mode, "calibration": s.calibration, "epsilon": s.eps, "delta": s.delta,
             "checks": [{"name": f.name, "passed": f.passed, "detail": f.detail,
                         "false_alarm": f.false_alarm} for f in fs]}
            for mode, s, fs in results]
        print(orjson.dumps({"gate": gate, "passed": passed, "configurations": rep},
                           option=orjson.OPT_INDENT_2).decode())
    for mode, s, fs in results:
        for f in fs:
            print(f"{s.mechanism} {s.calibration} {mode} (eps {s.eps:.6g}, delta "
                  f"{s.delta:.3g}): {f.name}: {'ok' if f.passed else 'FAILED'} ({f.detail})",
                  file=sys.stderr)
    failed = ", ".join(sorted({f.name for _, _, fs in results for f in fs if not f.passed}))
    caught = f" (caught by: {failed})" if failed else ""
    print(f"open-key audit {'PASSED' if passed else 'FAILED'} for the gate {gate}{caught} "
          f"(false-alarm rate <= {args.alpha:g})", file=sys.stderr)
    return 0 if passed else 1
