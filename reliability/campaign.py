"""The full-size fault and bad-input campaign; see reliability/README.md.

    nice python reliability/campaign.py --records 100000 --kills 52

Three phases, each on a deployment of its own, each checked on its own (processor/devtools/
campaign.py: lost, counted twice, conflicting values, bad records dead-lettered with their
reason, replay identical):

A. one worker, the fuzz corpus (`--records`, every category in the first chunk) fed in
   chunks, SIGKILLs (`--kills`) spread over startup, right after a marker, a backlog
   draining, inside a batch commit;
B. two workers of one group: SIGSTOP pauses of one past the session timeout (`--pauses`)
   and SIGKILLs of one of the two (`--pair-kills`), records fed meanwhile;
C. a three-node LocalKafka cluster: brokers SIGKILLed and restarted (`--broker-kills`)
   while one worker runs and records flow;
D. a three-node LocalKafka cluster (min ISR 2): two brokers SIGKILLed at once for
   `--outage-s` seconds (`--outages` times) while one worker runs and records are fed:
   producers, ingest and the worker can only wait;
E. network partitions: two workers of one deployment (4 timeline
   partitions, `--partition-counters` counters, `--partition-rate` events/s), worker A
   reaching its own single-node broker only through a TCP proxy; `--partitions-faults`
   faults per seed (blackholes of 12-20 s and 6-8 s with the connections kept open,
   resets of 12-20 s), for each of `--partition-seeds` (default: `--seed`); checked also
   against a recomputation of the published stream and the changelog;
U. privacy_unit = "user" (processor/devtools/unit_campaign.py): one deployment with small
   bounds (`--unit-k`, `--unit-m`), two workers of one group, `--unit-records` records
   (every bad category, bad unit ids, many events per unit over several counters),
   `--unit-kills` SIGKILLs (startup, after a marker, in a backlog, at the crash points of
   the bounding stage, the operator and ingest) and `--unit-rebalances` rebalances;
   checked: every record counted or dead-lettered once, the kept set against a
   recomputation of the bound, no unit beyond a bound, the published counts against the
   recomputation and replay's, no raw unit id outside the input and dead-letter topics;
K. open keys (processor/devtools/open_campaign.py): one worker of a deployment with an
   open family, keys from a Zipf(1.1) law over `--open-keys` keys fed at `--open-rate`
   events/s for `--open-seconds` s, `--open-kills` SIGKILLs meanwhile (with
   `--open-workers 2`, two workers of one group, a kill striking one; with
   `--open-partition-faults N`, N network partitions of one of two workers through a
   proxy, as phase E; with `--open-user`, privacy_unit = "user" and events from random
   units, k = m = 2); checked: every
   key's admission and records against the core gate on its input implied by the
   timeline (apart from the worker's code), in user mode first the kept set against the
   bounds' rule on the units topic, replay, and the changelog never going back.

Phases A, B, U and K use `--bootstrap` or, by default, a single local node this script starts;
phases C and D always start their own cluster, phase E its own proxied node. Every broker
and worker started here is stopped at the end. Prints one JSON document of figures; exit
code 0 when every phase passed.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from processor.devtools.campaign import (  # noqa: E402
    CAMPAIGN_SETTINGS,
    KillDriver,
    campaign_counters,
    check,
    kill_plan,
    partition_phase,
    partition_plan,
    refusals,
)
from processor.devtools.deployment import Deployment, isolated_deployment  # noqa: E402
from processor.devtools.kafka.cluster import LocalKafka  # noqa: E402
from processor.devtools.open_campaign import open_key_phase  # noqa: E402
from processor.devtools.proxy import ProxiedKafka  # noqa: E402
from processor.devtools.unit_campaign import unit_phase  # noqa: E402

#: Share of bad records in the fed corpus (the earlier campaign: 100,020 bad, 2,500 valid).
BAD_SHARE = 0.975


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@contextmanager
def broker(bootstrap: str | None, nodes: int = 1) -> Iterator[tuple[str, LocalKafka | None]]:
    """`bootstrap` as given, or a LocalKafka of `nodes` nodes started (and stopped) here."""
    if bootstrap:
        yield bootstrap, None
        return
    kafka = LocalKafka(nodes, heap="512m", start_timeout=300.0)
    kafka.start()
    try:
        yield kafka.bootstrap_servers, kafka
    finally:
        kafka.stop()


def deployment(bootstrap: str, name: str, parent: Path, counters: int) -> Deployment:
    return isolated_deployment(bootstrap, campaign_counters(counters, int(time.time() * 1000)),
                               parent=parent, name=name, **CAMPAIGN_SETTINGS)


def finish(driver: KillDriver, dep: Deployment, started: float,
           extra: dict[str, Any]) -> dict[str, Any]:
    say("draining and stopping the workers")
    caught_up = driver.drain_and_stop(dep.workers)
    say("checking")
    report = check(dep, driver.expected)
    out = {**extra, "caught_up": caught_up, "driver": dict(sorted(driver.counts.items())),
           **report.as_dict(), "wall_s": round(time.monotonic() - started, 1)}
    refused = refusals(driver.counts)
    if refused:
        out["ok"] = False
        out["refusals"] = refused
    say(f"phase done: ok={out['ok']} {report.replay_summary}"
        + (f"; refusals: {', '.join(refused)}" if refused else ""))
    return out


def phase_a(bootstrap: str, parent: Path, rng: random.Random, records: int,
            kills: int) -> dict[str, Any]:
    """One worker, the fuzz corpus in chunks, `kills` SIGKILLs over the four moments."""
    started = time.monotonic()
    dep = deployment(bootstrap, "campA", parent, 8)
    try:
        driver = KillDriver(dep, rng, bad_share=BAD_SHARE)
        dep.worker.start()
        plan = kill_plan(kills, rng)
        backlog_mean = sum(driver.backlog) / 2
        steady = max(0.0, records - backlog_mean * plan.count("backlog"))
        chunk = max(100, int(steady / (len(plan) + 1)))
        driver.feed(chunk)
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
        for i, moment in enumerate(plan, 1):
            driver.feed(min(chunk, max(0, records - driver.counts["records_fed"])) or 100)
            driver.kill(moment)
            if i % 5 == 0:
                say(f"A: {i}/{len(plan)} kills, {driver.counts['records_fed']} records fed")
        left = records - driver.counts["records_fed"]
        while left > 0:
            driver.feed(min(left, 5000))
            left = records - driver.counts["records_fed"]
        return finish(driver, dep, started, {"phase": "A: one worker, kills"})
    finally:
        dep.close()


def phase_b(bootstrap: str, parent: Path, rng: random.Random, records: int, pauses: int,
            pair_kills: int) -> dict[str, Any]:
    """Two workers: SIGSTOP pauses of one past the session timeout, kills of one."""
    started = time.monotonic()
    dep = deployment(bootstrap, "campB", parent, 8)
    try:
        other = dep.add_worker("worker-b")
        driver = KillDriver(dep, rng, bad_share=BAD_SHARE)
        dep.worker.start()
        other.start()
        steps = ["pause"] * pauses + ["kill"] * pair_kills
        rng.shuffle(steps)
        chunk = max(100, records // (len(steps) + 1))
        driver.feed(chunk)
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
        paused_s = 0.0
        for step in steps:
            driver.feed(chunk)
            victim = rng.choice(dep.workers)
            if step == "pause":
                seconds = rng.uniform(12.0, 18.0)  # past the 10 s session timeout
                driver.pause(victim, seconds)
                paused_s += seconds
            else:
                driver.kill(rng.choice(("startup", "marker")), victim)
        return finish(driver, dep, started, {"phase": "B: two workers, pauses and kills",
                                             "paused_s": round(paused_s, 1)})
    finally:
        dep.close()


def phase_c(parent: Path, rng: random.Random, records: int,
            broker_kills: int) -> dict[str, Any]:
    """A three-node cluster: brokers killed and restarted while records flow."""
    started = time.monotonic()
    with broker(None, nodes=3) as (bootstrap, cluster):
        assert cluster is not None
        dep = deployment(bootstrap, "campC", parent, 8)
        try:
            driver = KillDriver(dep, rng, bad_share=BAD_SHARE)
            dep.worker.start()
            chunk = max(100, records // (broker_kills + 1))
            driver.feed(chunk)
            dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
            down = 0.0
            for _ in range(broker_kills):
                driver.feed(chunk)
                seconds = rng.uniform(5.0, 15.0)
                driver.kill_broker(cluster, seconds)
                down += seconds
            return finish(driver, dep, started, {"phase": "C: three brokers, broker kills",
                                                 "broker_down_s": round(down, 1)})
        finally:
            dep.close()


def phase_d(parent: Path, rng: random.Random, records: int, outages: int,
            outage_s: float) -> dict[str, Any]:
    """A three-node cluster: two brokers down at once while records are fed."""
    started = time.monotonic()
    with broker(None, nodes=3) as (bootstrap, cluster):
        assert cluster is not None
        dep = deployment(bootstrap, "campD", parent, 8)
        try:
            driver = KillDriver(dep, rng, bad_share=BAD_SHARE)
            dep.worker.start()
            chunk = max(100, records // (2 * outages + 1))
            driver.feed(chunk)
            dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
            for i in range(outages):
                driver.feed(chunk)
                say(f"D: outage {i + 1}/{outages}: two brokers down for {outage_s:.0f} s")
                driver.broker_outage(cluster, 2, outage_s, feed=chunk)
            return finish(driver, dep, started, {"phase": "D: three brokers, two down at once",
                                                 "outage_s": outage_s})
        finally:
            dep.close()


def phase_e(parent: Path, seeds: list[int], faults: int, counters: int,
            rate: float, nodes: int) -> list[dict[str, Any]]:
    """Network partitions of one of two workers, one run per seed, on one proxied
    LocalKafka of `nodes` nodes (each node's proxied listener behind the one proxy)."""
    out: list[dict[str, Any]] = []
    kafka = ProxiedKafka(nodes, heap="512m", start_timeout=300.0)
    kafka.start()
    try:
        for seed in seeds:
            rng = random.Random(seed)
            plan = partition_plan(faults, rng)
            say(f"E: seed {seed}: {', '.join(plan)}")
            result = partition_phase(kafka, parent, rng, plan=plan, counters=counters,
                                     rate=rate, name=f"campE{seed}")
            result["seed"] = seed
            result["broker_nodes"] = nodes
            say(f"E: seed {seed}: ok={result['ok']} "
                f"violations={result['published']['violations']} "
                f"conflicting={result['published']['conflicting_ticks']} "
                f"changelog_back={result['changelog']['went_back']} "
                f"replay={result['replay_summary']}")
            out.append(result)
    finally:
        kafka.stop()
    return out


def phase_k(bootstrap: str, parent: Path, rng: random.Random, seconds: float, rate: float,
            keys: int, kills: int, workers: int, faults: int, user: bool = False
            ) -> dict[str, Any]:
    """Open keys: Zipf keys, one or two workers, kills, with `faults` > 0 network
    partitions of one of two workers (on a proxied broker of its own), the independent
    admission checker; `user`: privacy_unit = "user", the kept set checked too."""
    say(f"K: {seconds:g} s at {rate:g} events/s over {keys} keys, {kills} kills, "
        f"{workers} worker(s), {faults} network partition faults"
        + (", user mode" if user else ""))
    if faults:
        plan = partition_plan(faults, rng)
        kafka = ProxiedKafka(1, heap="512m", start_timeout=300.0)
        kafka.start()
        try:
            result = open_key_phase("", parent, rng, seconds=seconds, rate=rate, keys=keys,
                                    kills=kills, kafka=kafka, faults=plan, user=user)
        finally:
            kafka.stop()
        result["faults"] = plan
    else:
        result = open_key_phase(bootstrap, parent, rng, seconds=seconds, rate=rate,
                                keys=keys, kills=kills, workers=workers, user=user)
    say(f"K: ok={result['ok']} keys seen={result['keys_seen']} admitted="
        f"{result['keys_admitted']} violations={result['violations']} "
        f"replay identical={result['replay_identical']}")
    return result


def phase_u(bootstrap: str, parent: Path, rng: random.Random, records: int, kills: int,
            rebalances: int, k: int, m: int) -> dict[str, Any]:
    """privacy_unit = "user": two workers, kills (the stage's crash points too) and
    rebalances, the unit checkers."""
    say(f"U: {records} records, {kills} kills, {rebalances} rebalances, k={k}, m={m}")
    result = unit_phase(bootstrap, parent, rng, records=records, kills=kills,
                        rebalances=rebalances, k=k, m=m)
    u = result["units"]
    say(f"U: ok={result['ok']} counted={u['counted']} dead={u['dead_lettered']} "
        f"violations={u['violations']} published={result['published']['violations']} "
        f"replay={result['replay_cli'].get('verdict')}")
    return result


def save(path: str | None, results: list[dict[str, Any]]) -> None:
    """The phases done so far, so an interrupted run keeps what it measured."""
    if path:
        Path(path).write_text(json.dumps({"phases": results}, indent=2) + "\n",
                              encoding="utf-8")


def _interrupt(_signum: int, _frame: object) -> None:
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) unwind like Ctrl-C,
    # so every worker and broker is stopped on the way out.
    raise KeyboardInterrupt


@contextmanager
def _parent(keep: str | None) -> Iterator[Path]:
    """Where the deployments' files go: `keep` (made if missing, left in place), else a
    temporary directory deleted at the end."""
    if keep is not None:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="dpc-campaign-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000,
                   help="fuzzed records of phase A (default %(default)s)")
    p.add_argument("--kills", type=int, default=52,
                   help="SIGKILLs of phase A over the four moments (default %(default)s)")
    p.add_argument("--pauses", type=int, default=4, help="phase B pauses (default 4)")
    p.add_argument("--pair-kills", type=int, default=4,
                   help="phase B kills of one of the two workers (default 4)")
    p.add_argument("--broker-kills", type=int, default=3, help="phase C (default 3)")
    p.add_argument("--outages", type=int, default=2,
                   help="phase D: times two of three brokers go down at once (default 2)")
    p.add_argument("--outage-s", type=float, default=20.0,
                   help="phase D: how long they stay down (default %(default)s)")
    p.add_argument("--phase-records", type=int, default=5000,
                   help="records fed in phases B, C and D each (default %(default)s)")
    p.add_argument("--partitions-faults", type=int, default=4,
                   help="phase E: network partition faults per seed (default %(default)s)")
    p.add_argument("--partition-seeds", type=int, nargs="+",
                   help="phase E: one run per seed (default: --seed)")
    p.add_argument("--partition-counters", type=int, default=400,
                   help="phase E: declared counters (default %(default)s)")
    p.add_argument("--partition-rate", type=float, default=200.0,
                   help="phase E: valid events a second (default %(default)s)")
    p.add_argument("--partition-nodes", type=int, default=1,
                   help="phase E: broker nodes, 1 or 3 (default %(default)s)")
    p.add_argument("--unit-records", type=int, default=5000,
                   help="phase U: records fed (default %(default)s)")
    p.add_argument("--unit-kills", type=int, default=10,
                   help="phase U: SIGKILLs of one of the two workers (default %(default)s)")
    p.add_argument("--unit-rebalances", type=int, default=3,
                   help="phase U: a worker stopped and started (default %(default)s)")
    p.add_argument("--unit-k", type=int, default=2,
                   help="phase U: max_events_per_counter (default %(default)s)")
    p.add_argument("--unit-m", type=int, default=3,
                   help="phase U: max_counters_per_unit (default %(default)s)")
    p.add_argument("--open-seconds", type=float, default=60.0,
                   help="phase K: how long keyed events are fed (default %(default)s)")
    p.add_argument("--open-rate", type=float, default=40.0,
                   help="phase K: keyed events a second (default %(default)s)")
    p.add_argument("--open-keys", type=int, default=300,
                   help="phase K: keys of the Zipf law (default %(default)s)")
    p.add_argument("--open-kills", type=int, default=3,
                   help="phase K: SIGKILLs of the worker (default %(default)s)")
    p.add_argument("--open-workers", type=int, choices=(1, 2), default=1,
                   help="phase K: workers of the group, a kill strikes one (default 1)")
    p.add_argument("--open-user", action="store_true",
                   help='phase K: privacy_unit = "user" (k = 2, m = 2; events from random '
                        "units), the kept set checked too")
    p.add_argument("--open-partition-faults", type=int, default=0,
                   help="phase K: network partitions of one of two workers, on a proxied "
                        "broker of its own (default %(default)s)")
    p.add_argument("--phases", default="ABCD",
                   help="which phases to run (default ABCD; E: network partitions; "
                        "U: privacy_unit = user; K: open keys)")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--bootstrap", help="broker of phases A and B (default: start one)")
    p.add_argument("--out", help="also write the JSON figures to this file")
    p.add_argument("--keep", metavar="DIR",
                   help="keep every deployment's files (configurations, worker logs, "
                        "state directories) in DIR, to read after a failed phase; with "
                        "--bootstrap its topics stay on that broker too")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    with _parent(args.keep) as parent:
        needs_single = bool({"A", "B", "U", "K"} & set(args.phases))
        ctx = broker(args.bootstrap) if needs_single else nullcontext(("", None))
        with ctx as (bootstrap, _kafka):
            runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("A", lambda: phase_a(bootstrap, parent, rng, args.records, args.kills)),
                ("B", lambda: phase_b(bootstrap, parent, rng, args.phase_records,
                                      args.pauses, args.pair_kills)),
                ("U", lambda: phase_u(bootstrap, parent, rng, args.unit_records,
                                      args.unit_kills, args.unit_rebalances, args.unit_k,
                                      args.unit_m)),
                ("K", lambda: phase_k(bootstrap, parent, rng, args.open_seconds,
                                      args.open_rate, args.open_keys, args.open_kills,
                                      args.open_workers, args.open_partition_faults,
                                      args.open_user)),
            ]
            for name, run in runs:
                if name in args.phases:
                    say(f"phase {name}")
                    results.append(run())
                    save(args.out, results)
        if "C" in args.phases:
            say("phase C")
            results.append(phase_c(parent, rng, args.phase_records, args.broker_kills))
            save(args.out, results)
        if "D" in args.phases:
            say("phase D")
            results.append(phase_d(parent, rng, args.phase_records, args.outages,
                                   args.outage_s))
            save(args.out, results)
        if "E" in args.phases:
            say("phase E")
            results.extend(phase_e(parent, args.partition_seeds or [args.seed],
                                   args.partitions_faults, args.partition_counters,
                                   args.partition_rate, args.partition_nodes))
            save(args.out, results)
    kills: Counter[str] = Counter()
    for r in results:
        kills.update({k: v for k, v in r["driver"].items()
                      if k.startswith(("kills_", "faults_"))})
    summary = {"ok": all(r["ok"] for r in results), "seed": args.seed,
               "wall_s": round(time.monotonic() - started, 1),
               "kills": dict(sorted(kills.items())), "phases": results}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
