"""The Quix Streams peer of `bench_stream.py`: a stateful count per counter.

    QUIX_PYTHON bench/peer_quix.py BOOTSTRAP SRC OUT N STATE_DIR

Reads the JSON events of SRC, `group_by("counter")` (Quix's repartition topic), then a
stateful apply that increments the counter's count in Quix's RocksDB state (with its
changelog topic, Quix's defaults: exactly the "same input, same count" peer of the
processor's operator), and produces one record per event to OUT, key = counter, value
`{"counter": c, "count": n}`.

It imports nothing of the repository and runs in its own interpreter: quixstreams pins a
confluent-kafka older than the processor's environment, so the bench starts it with the
Python named by --quix-python (see bench/README.md for making that environment).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any


def main(argv: list[str]) -> int:
    bootstrap, src, out, _n, state_dir = argv
    from quixstreams import Application, State

    # The group carries the output topic's suffix, so the bench finds the changelog and
    # repartition topics Quix names after it.
    suffix = out.rsplit("-", 1)[-1]
    app = Application(broker_address=bootstrap,
                      consumer_group=f"bench-quix-{suffix}-{uuid.uuid4().hex[:4]}",
                      auto_offset_reset="earliest", state_dir=state_dir, loglevel="WARNING")
    sdf = app.dataframe(app.topic(src, value_deserializer="json"))
    sdf = sdf.group_by("counter")

    def count(value: dict[str, Any], state: State) -> dict[str, Any]:
        n = int(state.get("n", 0)) + 1
        state.set("n", n)
        return {"counter": value["counter"], "count": n}

    sdf = sdf.apply(count, stateful=True)
    sdf.to_topic(app.topic(out, value_serializer="json"))
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
