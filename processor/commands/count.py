"""`python -m processor count`: run a registered mechanism over a file of ticks.

The tick file is read and run by processor/commands/offline.py; this module is the
command: its parser, the key (a key file or a public seed), one JSON line per tick.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from processor.commandline import CommandParser
from processor.errors import print_error


def count_parser() -> argparse.ArgumentParser:
    from processor.core import registry
    from processor.core.rng import KEY_FORMATS
    from processor.core.tight import CALIBRATIONS

    p = CommandParser(
        prog="python -m processor count", allow_abbrev=False,
        description="Run a private counter over ticks read one per line: a number in [0, 1], "
        "_ for a tick with no event, _*N for N such ticks. Writes {\"t\": t, \"y\": y} per tick.",
    )
    p.add_argument("--mechanism", required=True, choices=registry.names(),
                   help="the registered mechanism to run")
    p.add_argument("--epsilon", type=float, required=True, help="privacy parameter epsilon")
    p.add_argument("--delta", type=float, required=True, help="privacy parameter delta")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--key-file", help="the secret noise key (production generator)")
    src.add_argument("--seed", type=int, help="a public, reproducible key (tests, experiments)")
    p.add_argument("--key-format", choices=KEY_FORMATS, default="hex",
                   help="how --key-file is read: hex (default, what keygen writes) or raw")
    p.add_argument("--input", help="tick file (default: standard input)")
    p.add_argument("--changes", action="store_true",
                   help="print only the ticks where y changes, plus the last tick")
    p.add_argument("--counter-id", default="offline",
                   help="the counter identity the noise stream is keyed by (default: offline)")
    p.add_argument("--horizon", type=int, help="stream length T (partitioncc needs it)")
    p.add_argument("--base", choices=("tree", "sqrt"), help="basecc's bounded counter")
    p.add_argument("--calibration", choices=CALIBRATIONS,
                   help="ecc/simecc: the paper's constants (default) or the tight analysis "
                        "(docs/tight-calibration.md)")
    p.add_argument("--with-bound", action="store_true",
                   help="add \"bound\": |y_t - s_t| <= bound with probability >= 1 - beta "
                        "at that tick (public: parameters and t only)")
    p.add_argument("--beta", type=float, default=0.05, help="failure probability of --with-bound")
    return p



def cmd_count(argv: Sequence[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    args = count_parser().parse_args(argv)
    import orjson

    from processor.commands.offline import TickSyntaxError, parse_ticks, run_counter
    from processor.core import registry
    from processor.core.errors import CoreError
    from processor.core.rng import NoiseKey
    from processor.keyfile import read_key

    try:
        key = (read_key(args.key_file, args.key_format) if args.key_file
               else NoiseKey.from_seed(args.seed))
        params: dict[str, object] = {}
        if args.horizon is not None:
            params["horizon"] = args.horizon
        if args.base is not None:
            params["base"] = args.base
        if args.calibration is not None:
            params["calibration"] = args.calibration
        counter = registry.make(args.mechanism, args.epsilon, args.delta, key, args.counter_id,
                                **params)
        if args.with_bound:
            counter.error_bound(args.beta)  # the mechanism's own check of beta, up front
    except (CoreError, TypeError) as exc:
        print_error(str(exc), stderr)
        return 2
    try:
        source = open(args.input, encoding="utf-8") if args.input else stdin  # noqa: SIM115
    except OSError as exc:
        print_error(f"cannot read {args.input!r}: {exc.strerror}", stderr)
        return 2
    try:
        out = []
        for t, y in run_counter(counter, parse_ticks(source), changes_only=args.changes):
            row: dict[str, float] = {"t": t, "y": y}
            if args.with_bound:
                row["bound"] = counter.error_bound_at(t, args.beta)
            out.append(orjson.dumps(row))
            if len(out) >= 4096:
                stdout.write(b"\n".join(out).decode() + "\n")
                out.clear()
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
    except TickSyntaxError as exc:
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
        print_error(str(exc), stderr)
        return 2
    finally:
        if source is not stdin:
            source.close()
    return 0



def main_count(argv: Sequence[str]) -> int:
    return cmd_count(argv, sys.stdin, sys.stdout, sys.stderr)

