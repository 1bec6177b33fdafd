"""A scaled-down DP-SQLP synthetic setup through the stream (docs/open-keys.md, "Beside
the nearest peer").

    .venv/bin/python bench/bench_dpsqlp.py --seeds 0 1 2 --json out.json

User mode with an open family: a unit (user) contributes one event (k = 1) to each of at
most m = 32 keys, target (eps, delta) = (6, 1e-9) per user over the whole published
output: delta_u = delta_sel = 5e-10 (releases, then the gate's term for 32 keys, so
unit_delta_total = 1e-9). Each batch (DP-SQLP's micro-batch, `--ticks-per-batch` ticks)
brings `--users-per-batch` new users; each draws 32 keys from Zipf(`--zipf`) over
`--keys` keys, repeats dropped, one event each at a tick of the batch (default one user
per tick: nearly all draw the heaviest key, so it gets about one event per tick, what
the queue passes). The events go
through the stream's stages in process (no broker): units rows -> the bounding stage
(`bounding.Bounder`) -> its timeline records -> the operator (`Operator`), one marker
per batch. At `--horizons` batches: keys seen, keys retained (admitted), and over the
retained keys the L-infinity and L2 error of the released count against the true count
(the key's events stamped up to the horizon). Prints one JSON line per (seed, horizon);
`--json` writes them all, with the parameters and the retained keys' (true, released)
pairs for `bench/plot_dpsqlp.py`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import time
from typing import Any

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.model.bounding import Bounder, encode_units, unit_hash, unit_key
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.families import OpenFamily, key_counter
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore

EPS_U, DELTA_U, DELTA_SEL = 6.0, 5e-10, 5e-10
K, M = 1, 32
TICK_MS = 1000


def _zipf_cum(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (r ** s) for r in range(1, n + 1)))


def run(seed: int, keys: int, zipf: float, users_per_batch: int, ticks_per_batch: int,
        horizons: list[int], mechanism: str, calibration: str) -> list[dict[str, Any]]:
    """One seed through the stream; one result per horizon (in batches)."""
    s = with_unit(with_overrides(
        Settings(), counters={}, families={"f": OpenFamily(0, DELTA_SEL)}, partitions=1,
        tick_ms=TICK_MS, heartbeat_ticks=1_000_000, heartbeat_spread=False,
        mechanism=mechanism, calibration=calibration), EPS_U, DELTA_U, K, M)
    key = NoiseKey.from_seed(seed)
    rng = random.Random(seed)
    cum = _zipf_cum(keys, zipf)
    names = [key_counter("f", f"k{r}") for r in range(keys)]
    ukey = unit_key(key)
    bounder = Bounder(s)
    btxn = bounder.transaction(DictStore())
    op = Operator(s, key, cache_size=keys + 16)  # no key evicted between markers
    store = DictStore()
    offset = 0
    truth: dict[str, list[int]] = {}  # key -> event ticks
    released: dict[str, float] = {}
    dead = 0
    out_rows: list[dict[str, Any]] = []
    t0 = time.process_time()
    user = 0
    src = 0

    def apply(record: bytes) -> Output:
        nonlocal offset
        txn = op.transaction(store)
        out = op.apply(txn, 0, offset, record)
        op.stage_deferred(txn, 0)
        store.write_many(txn.prepare())
        txn.complete()
        offset += 1
        return out

    for batch in range(max(horizons)):
        rows: list[list[object]] = []
        for _ in range(users_per_batch):
            uid = f"u{user}"
            user += 1
            tick = batch * ticks_per_batch + rng.randrange(ticks_per_batch)
            h = unit_hash(ukey, uid)
            for r in sorted(set(rng.choices(range(keys), cum_weights=cum, k=M))):
                src += 1
                rows.append([h, names[r], tick * TICK_MS + 1, UNIT, 0, src])
                truth.setdefault(names[r], []).append(tick)
        rows.sort(key=lambda row: row[2])  # type: ignore[arg-type, return-value]
        bout = Output()
        bounder.apply(btxn, 0, [(batch, encode_units(rows))], bout)
        dead += len(bout.deadletters)
        for _, data in bout.timeline:
            apply(data)
        horizon_tick = (batch + 1) * ticks_per_batch - 1
        out = apply(encode_marker(horizon_tick))
        for rel in out.decoded_releases():
            released[rel.counter] = rel.value
        if batch + 1 in horizons:
            pairs = [(sum(1 for t in ts if t <= horizon_tick), released[name])
                     for name, ts in truth.items() if name in released]
            errs = [abs(y - n) for n, y in pairs]
            out_rows.append({
                "seed": seed, "batches": batch + 1, "ticks": horizon_tick + 1,
                "users": user, "events": src, "dead_letters": dead,
                "keys_seen": len(truth), "keys_retained": len(pairs),
                "events_of_retained": sum(n for n, _ in pairs),
                "linf": max(errs, default=0.0),
                "l2": math.sqrt(math.fsum(e * e for e in errs)),
                "max_true_count": max(len(ts) for ts in truth.values()),
                "cpu_s": round(time.process_time() - t0, 1),
                "pairs": sorted(pairs),
            })
    return out_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--ticks-per-batch", type=int, default=10)
    ap.add_argument("--users-per-batch", type=int, default=0,
                    help="default: about one event per tick on the heaviest key")
    ap.add_argument("--horizons", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--mechanism", default="simecc", choices=("simecc", "ecc"))
    ap.add_argument("--calibration", default="paper", choices=("paper", "tight"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    # Nearly every user draws the heaviest key (32 draws, its share 1 / H(keys, s)):
    # one user per tick puts about one event per tick on it.
    upb = a.users_per_batch if a.users_per_batch > 0 else a.ticks_per_batch
    results = []
    for seed in a.seeds:
        for row in run(seed, a.keys, a.zipf, upb, a.ticks_per_batch, sorted(a.horizons),
                       a.mechanism, a.calibration):
            print(json.dumps({k: v for k, v in row.items() if k != "pairs"}), flush=True)
            results.append(row)
    if a.json:
        params = {k: v for k, v in vars(a).items() if k != "json"}
        params.update(users_per_batch=upb, epsilon=EPS_U, delta=DELTA_U + DELTA_SEL,
                      max_counters_per_unit=M, max_events_per_counter=K,
                      loadavg=os.getloadavg()[0])
        with open(a.json, "w") as f:
            json.dump({"parameters": params, "results": results}, f)


if __name__ == "__main__":
    main()
