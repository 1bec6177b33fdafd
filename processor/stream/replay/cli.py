"""`python -m processor replay`: the command line of the audit (its parser, progress lines
on stderr, the verdict on stdout as a line or one JSON object, the exit code)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import orjson

from processor.commandline import CommandParser
from processor.core.rng import KEY_FORMATS
from processor.stream.model.config import load_noise_key, load_settings
from processor.stream.model.logs import configure_logging
from processor.stream.replay.snapshot import replay


class StderrProgress:
    """Progress lines on stderr, at most one every `every_s` seconds."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._every = every_s
        self._next = time.monotonic() + every_s

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        what = "timeline records read" if stage == "read" else "timeline records recomputed"
        print(f"replay: {done}/{total} {what}", file=sys.stderr, flush=True)


#: The exit code of differences found under a configuration or key the ledger contradicts.
EXIT_CONFIGURATION = 3


def _parser() -> CommandParser:
    p = CommandParser(
        prog="python -m processor replay",
        description="Recompute the private counts and ledger entries from the timeline "
        "topic and compare them with the published topics, through the cut defined in "
        "docs/replay.md (safe on a running worker and after any stop). Exit 0: identical; "
        "1: different; 2: no verdict (an error); 3: different, and the configuration or "
        "key given differs from the ledger's (named in the first line).")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (default: the configured one)")
    p.add_argument("--key-format", choices=KEY_FORMATS,
                   help="how the key file is read (default: noise_key_format, hex)")
    p.add_argument("--json", action="store_true",
                   help="print the verdict as one JSON object (verdict, cut, counts, the "
                   "first differences) instead of a line of text")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the brokers and for each topic read "
                   "(default 120)")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes that recompute timeline partitions in parallel "
                   "(default: one per partition, at most one per CPU; the verdict does not "
                   "depend on it)")
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds a due record missing from the snapshot may take to arrive "
                   "before it is reported (a worker catching up after a rebalance; default 5)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (by default one every 2 s)")
    return p


def main_replay(argv: Sequence[str] | None = None) -> int:
    """`python -m processor replay --config F [--key-file K] [--json]`: exit 0 identical,
    1 different, 3 different under a configuration or key the ledger contradicts; errors
    propagate to the dispatcher's error policy (one line, exit 2)."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    configure_logging("warning")  # the client loggers' floors (logs.py)
    settings = load_settings(args.config)
    key = load_noise_key(settings, args.key_file, args.key_format)
    report = replay(settings, key, timeout_s=args.timeout, jobs=args.jobs,
                    settle_s=args.settle,
                    progress=None if args.quiet else StderrProgress())
    if args.json:
        print(orjson.dumps(report.to_json()).decode())
    else:
        print(report.summary())
    if report.configuration_differs:
        return EXIT_CONFIGURATION
    return 0 if report.identical else 1
