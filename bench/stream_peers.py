"""The processor's peers in `bench_stream.py`, each a child program reading one input topic
and writing one output topic on the same broker.

    python bench/stream_peers.py KIND BOOTSTRAP SRC OUT N WORKDIR

KIND is one of:

- `faust-agent`: today's plain Faust agent (stateless, no JSON parsing): counts the
  records of SRC, appends b"warm" after the first (the warm-up record) and b"done" after N
  more. Not a counting peer; kept as the figure earlier runs reported.
- `faust-table`: a Faust count per counter: the events parsed (a faust.Record),
  `group_by(counter)` (a repartition topic), a `Table` of ints on Faust's RocksDB store with
  its changelog topic; one output record per event, key = counter, value
  `{"counter": c, "count": n}` (the new count).
- `kafka-loop`: the plain confluent-kafka consume -> produce loop (batched consume,
  asynchronous produce of each record to OUT, same partition): the physical limit of
  Python on this broker. No parsing, no state.

The Quix Streams count is `peer_quix.py`: it runs in its own interpreter (quixstreams pins
another confluent-kafka than the processor's environment).

Each child stays alive after its work until the bench stops it: nothing after its last
output belongs to the measurement, and leaving the group would only add noise.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def faust_agent(bootstrap: str, src: str, out: str, n: int, workdir: str) -> None:
    import asyncio

    import faust

    app = faust.App(f"bench-faust-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}",
                    web_enabled=False, consumer_auto_offset_reset="earliest",
                    store="memory://", datadir=workdir)
    src_topic = app.topic(src, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")
    out_topic = app.topic(out, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")

    async def count(stream: Any) -> None:
        seen = 0
        async for _value in stream:
            seen += 1
            if seen == 1:
                await out_topic.send(value=b"warm")
            elif seen == n + 1:
                await out_topic.send(value=b"done")

    app.agent(src_topic, name="bench-count")(count)
    asyncio.set_event_loop(asyncio.new_event_loop())
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def faust_table(bootstrap: str, src: str, out: str, _n: int, workdir: str) -> None:
    import asyncio

    import faust
    import orjson

    class Ev(faust.Record, serializer="json"):
        counter: str
        ts: int
        value: int

    # The app id carries the output topic's suffix, so the bench finds its changelog and
    # repartition topics by it.
    app = faust.App(f"bench-ftable-{out.rsplit('-', 1)[-1]}", broker=f"kafka://{bootstrap}",
                    web_enabled=False, consumer_auto_offset_reset="earliest",
                    store="rocksdb://", datadir=workdir, topic_partitions=4)
    src_topic = app.topic(src, value_type=Ev)
    out_topic = app.topic(out, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")
    table = app.Table("counts", default=int, partitions=4)

    async def count(stream: Any) -> None:
        async for ev in stream.group_by(Ev.counter, name="bycounter"):
            table[ev.counter] += 1
            await out_topic.send(key=ev.counter.encode(), value=orjson.dumps(
                {"counter": ev.counter, "count": table[ev.counter]}))

    app.agent(src_topic, name="bench-table-count")(count)
    asyncio.set_event_loop(asyncio.new_event_loop())
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def kafka_loop(bootstrap: str, src: str, out: str, n: int, _workdir: str) -> None:
    from confluent_kafka import Consumer

    from processor.stream.kafka import kafka_io

    conf = {**{"bootstrap.servers": bootstrap}, "log_level": "3"}
    consumer = Consumer({**conf, "group.id": f"bench-loop-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false", "auto.offset.reset": "earliest"})
    producer = kafka_io.make_producer(conf)
    consumer.subscribe([src])
    seen = 0
    try:
        while seen < n + 1:
            for msg in consumer.consume(num_messages=1000, timeout=0.1):
                if msg.error() is not None:
                    continue
                while True:
                    try:
                        producer.produce(out, value=msg.value(),
                                         partition=int(msg.partition() or 0))
                        break
                    except BufferError:
                        producer.poll(0.01)
                seen += 1
                if seen == 1:
                    producer.flush(30)
            producer.poll(0)
        producer.flush(60)
        while True:  # stay until the bench stops this process (see the module docstring)
            time.sleep(3600)
    finally:
        consumer.close()


PEERS = {"faust-agent": faust_agent, "faust-table": faust_table, "kafka-loop": kafka_loop}


def main(argv: list[str]) -> int:
    kind, bootstrap, src, out, n, workdir = argv
    PEERS[kind](bootstrap, src, out, int(n), workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
