"""The start's bulk load alone (processor/stream/worker/bulkload.py): changelog records
per second into empty local databases, at sizes a worker's start cannot reach on this
machine (creating a million counters holds about 7 GB of decoded idle counters in the
first worker).

Workload: a compacted changelog topic of --partitions partitions (default 4) holding
--keys keys (default 1,000,000) twice each (a counter written at two checkpoints): values
of --value-bytes bytes (default 200, about a stored idle counter) with the offset header
of state.py, the second newer than the first. Then --repeats times (default 3): the bulk
load into a fresh directory, timed; each must read every record and leave every key at
its newer value (checked on a sample). Reported: records/s per repeat (range), seconds,
the process's peak RSS, the load average.

    .venv/bin/python bench/bench_bulkload.py [--keys 1000000] [--repeats 3]
        [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rocksdict import Options as RdictOptions
from rocksdict import Rdict

from processor.stream.kafka import kafka_io
from processor.stream.model.state import UNIT_MAGIC, stored_offset
from processor.stream.worker.bulkload import bulk_load

TABLE = "dpc-state"


def _value(version: int, pad: bytes) -> bytes:
    return UNIT_MAGIC + version.to_bytes(8, "big", signed=True) + pad


def produce(conf: dict[str, str], topic: str, keys: int, partitions: int,
            value_bytes: int) -> int:
    """The changelog: every key twice, the second value newer; returns the records."""
    kafka_io.create_topics(conf, [topic], partitions, replication=1,
                           config={"cleanup.policy": "compact"}, timeout_s=30)
    producer = Producer({**conf, "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000})
    pad = b"x" * max(0, value_bytes - 12)
    for version in range(2):
        for i in range(keys):
            value = _value(version * keys + i, pad)
            while True:
                try:
                    producer.produce(topic, value, key=b"c/m%07d" % i,
                                     partition=i % partitions)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            if i % 10_000 == 0:
                producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("the changelog was not fully produced")
    return 2 * keys


def check_sample(directory: Path, keys: int, partitions: int) -> None:
    """A sample of keys holds its newer value (the bulk load kept the monotone merge)."""
    rng = random.Random(5)
    for i in rng.sample(range(keys), min(keys, 200)):
        path = directory / f"{TABLE}-{i % partitions}.db"
        db: Any = Rdict(str(path), options=RdictOptions(raw_mode=True))
        try:
            got = db.get(b"c/m%07d" % i)
        finally:
            db.close()
        if got is None or stored_offset(bytes(got)) != keys + i:
            raise RuntimeError(f"key {i}: not its newer value after the load")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--value-bytes", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    a = p.parse_args(argv)
    if not a.bootstrap:
        print("error: --bootstrap or KAFKA_BOOTSTRAP_SERVERS is required", file=sys.stderr)
        return 2
    conf = {"bootstrap.servers": a.bootstrap}
    topic = f"bench-bulkload-{uuid.uuid4().hex[:10]}"
    began = time.monotonic()
    records = produce(conf, topic, a.keys, a.partitions, a.value_bytes)
    print(f"changelog {topic}: {records:,} records ({a.keys:,} keys x 2, "
          f"{a.value_bytes} bytes a value) in {time.monotonic() - began:.1f} s", flush=True)
    rates = []
    with tempfile.TemporaryDirectory(prefix="dpc-bulkload-") as tmp:
        for k in range(a.repeats):
            directory = Path(tmp) / f"run{k}"
            got = bulk_load(conf, directory, {TABLE: topic})
            if got.records != records or not got.complete:
                raise RuntimeError(f"run {k}: read {got.records:,} of {records:,} records")
            check_sample(directory, a.keys, a.partitions)
            shutil.rmtree(directory)
            rates.append(got.records / got.seconds)
            print(f"  run {k + 1}: {got.records:,} records in {got.seconds:.1f} s, "
                  f"{rates[-1]:,.0f} records/s; load average {os.getloadavg()[0]:.2f}",
                  flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bulk load: {min(rates):,.0f}-{max(rates):,.0f} records/s over {a.repeats} runs "
          f"({a.keys:,} keys, {records:,} records); peak RSS of this process {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
