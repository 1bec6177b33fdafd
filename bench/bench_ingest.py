"""Ingest's CPU per input record, in this process, no broker: `ingest.route` (parse, check,
group by timeline partition, encode the timeline batches) over input batches as the
ingest loop hands them over, with `parse_input` (its plain-event fast path) beside
`parse_input_reference` (every check in turn), alternated, best of --repeats each.

Loads: "plain" (an integer ts and a value of 1, the README's producer's events), "mixed"
(a third each: plain, an ISO-8601 ts, a value of 0.5) and "rejected" (undeclared
counters: dead letters). Every route's output is compared between the two parsers: the
same timeline bytes and dead letters, or the bench stops.

    .venv/bin/python bench/bench_ingest.py [--records 100000] [--counters 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import orjson

from processor.stream.kafka.ingest import InputRecord, route
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.records import (
    Event,
    Rejection,
    parse_input,
    parse_input_reference,
)

#: Records per `route` call: ingest's largest consume (ingest.MAX_CONSUME).
BATCH = 5000


def records(kind: str, n: int, names: list[str], now_ms: int,
            rng: random.Random) -> list[list[InputRecord]]:
    """`n` input records of load `kind`, in batches of BATCH."""
    out: list[InputRecord] = []
    for i in range(n):
        d: dict[str, object] = {"counter": rng.choice(names), "ts": now_ms - 1000, "value": 1}
        if kind == "mixed" and i % 3 == 1:
            d["ts"] = "2026-01-01T00:00:00.123Z"
        elif kind == "mixed" and i % 3 == 2:
            d["value"] = 0.5
        elif kind == "rejected":
            d["counter"] = f"undeclared-{i % 50}"
        out.append(InputRecord(i % 4, i, orjson.dumps(d)))
    return [out[i:i + BATCH] for i in range(0, n, BATCH)]


def timed(batches: list[list[InputRecord]], settings: Settings, now_ms: int,
          parse: Callable[..., Event | Rejection]) -> tuple[float, list[object]]:
    """CPU seconds of routing every batch, and what each became."""
    got: list[object] = []
    t = time.process_time()
    for batch in batches:
        r = route(batch, settings, now_ms, parse=parse, source="input")
        got.append((r.timeline, r.deadletters))
    return time.process_time() - t, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--counters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    names = [f"c{i:05d}" for i in range(args.counters)]
    now_ms = 1_767_225_600_000 + 3_600_000
    settings = with_overrides(Settings(), counters={n: 1_767_225_600_000 for n in names},
                              partitions=4)
    print(f"route, CPU-us per input record ({args.records:,} records in batches of "
          f"{BATCH:,}, {args.counters} counters, best of {args.repeats}):")
    for kind in ("plain", "mixed", "rejected"):
        batches = records(kind, args.records, names, now_ms, random.Random(0))
        best = {"fast": float("inf"), "reference": float("inf")}
        for _ in range(args.repeats):
            for label, parse in (("fast", parse_input), ("reference", parse_input_reference)):
                cpu, got = timed(batches, settings, now_ms, parse)
                best[label] = min(best[label], cpu)
                if label == "fast":
                    fast_got = got
                elif got != fast_got:
                    raise SystemExit(f"{kind}: the two parsers routed differently")
        us = {k: v / args.records * 1e6 for k, v in best.items()}
        print(f"  {kind:9s} parse_input {us['fast']:.2f}, parse_input_reference "
              f"{us['reference']:.2f} ({us['fast'] / us['reference']:.2f}x)")


if __name__ == "__main__":
    main()
