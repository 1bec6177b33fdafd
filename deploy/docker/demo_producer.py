"""The demo producer of deploy/compose.yaml: the demo's bursty traffic, forever.

`python -m processor demo` has no producer-only mode (it starts its own broker and worker),
so this runs the same traffic plan (`processor.devtools.demo.TrafficPlan`: Poisson rates,
bursts, idle gaps, a few late and a few bad records) window after window against the
broker and input topic of the worker's config file. It reads only public parts of that file
(bootstrap servers, security, topic names); the noise key is not mounted into it.

    python /opt/dpc/demo_producer.py --config /etc/dpc/config.toml [--window-s 60]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence

import orjson

from processor.devtools.demo import TrafficPlan
from processor.stream.kafka import kafka_io
from processor.stream.model.config import ConfigError, Settings, load_settings


def window_records(plan: TrafficPlan, seconds: float, seed: int, late_ms: int,
                   base_ms: int) -> list[tuple[float, bytes]]:
    """(seconds after the window's start, raw record) for one window, in time order.
    Valid events are stamped `base_ms` + their offset (minus their lateness)."""
    out: list[tuple[float, bytes]] = []
    for r in plan.plan(seconds, seed, late_ms=late_ms):
        if r.valid and r.counter is not None:
            ts = base_ms + int(r.at_s * 1000) - r.late_by_ms
            out.append((r.at_s, orjson.dumps({"counter": r.counter, "ts": ts})))
        else:
            out.append((r.at_s, r.raw))
    return out


def undeclared(plan: TrafficPlan, settings: Settings) -> list[str]:
    """The plan's counters the configuration does not declare (their events would all be
    dead letters)."""
    return [c for c in plan.counters if c not in settings.counters]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_producer.py", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="/etc/dpc/config.toml",
                   help="the worker's configuration (broker, security, topics, counters)")
    p.add_argument("--window-s", type=float, default=60.0,
                   help="length of one planned traffic window, seconds (default 60)")
    p.add_argument("--seed", type=int, default=7,
                   help="seed of the first window's traffic (not noise); +1 per window")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"error: configuration: {exc}", file=sys.stderr)
        return 2
    plan = TrafficPlan()
    missing = undeclared(plan, settings)
    if missing:
        print(f"error: counters not declared in {args.config}: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    producer = kafka_io.make_producer(kafka_io.base_config(settings))
    late_ms = 3 * settings.tick_ms + settings.lateness_ms
    print(f"producing to {settings.topics.input} at {settings.bootstrap_servers}", flush=True)
    try:
        for window in itertools.count():
            t0 = time.monotonic()
            base_ms = int(time.time() * 1000)
            for at_s, raw in window_records(plan, args.window_s, args.seed + window, late_ms,
                                            base_ms):
                wait = at_s - (time.monotonic() - t0)
                if wait > 0:
                    time.sleep(wait)
                producer.produce(settings.topics.input, value=raw)
                producer.poll(0)
            producer.flush(30)
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
