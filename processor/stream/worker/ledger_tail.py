"""What the ledger topic announced since the worker's start read: `LedgerTail`, read at
each assignment (app.Worker.on_assigned) and right before a batch that creates counters
is published (app.OperatorStage.vet), and given to the operator
(`Operator.learn_announced`, `Operator.check_ledger`).

The start reads the whole ledger once (app.read_ledger): the operator refuses to create
a counter the ledger announced under another creation (AnnouncedCounterError). A worker
that runs for long does not see, by that read alone, the counters other workers of its
group created since: a partition it takes over without a counter's state (a state the
restore did not bring back) would have it create that counter a second time, silently.
Reading on from where the last read ended makes the running worker refuse exactly what a
worker started now would. The assignment's read is not ordered before the assignment's
first records (Faust's recovery may resume the partitions while it runs); the read
before a creation is published is (docs/state.md, "A creation is published at most
once").
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from processor.stream.kafka import kafka_io
from processor.stream.model import lifetime
from processor.stream.model.records import announced_in


class LedgerTail:
    """The ledger topic read on from `start` (partition -> the next offset to read; a
    partition not listed is read from its first record)."""

    def __init__(self, conf: Mapping[str, str], topic: str, start: Mapping[int, int],
                 timeout_s: float) -> None:
        self._conf = dict(conf)
        self._topic = topic
        self._next = dict(start)
        self._timeout_s = timeout_s
        # One read at a time: the assignment's and a creating batch's (app.OperatorStage
        # .vet) run in executor threads.
        self._lock = threading.Lock()

    def read(self) -> dict[str, frozenset[str]]:
        """What the records since the last read announced (counter -> creation tags);
        blocking. A failure (KafkaException, RuntimeError, TimeoutError) raises and keeps
        the position: the next read covers those records again."""
        with self._lock:
            marks = kafka_io.end_offsets(self._conf, self._topic, timeout_s=self._timeout_s)
            spans = {p: (max(lo, self._next.get(p, lo)), hi) for p, (lo, hi) in marks.items()}
            got = kafka_io.read_values(self._conf, self._topic, spans,
                                       timeout_s=self._timeout_s)
            values = [value for _p, records in sorted(got.items()) for _o, value in records]
            announced = announced_in(lifetime.ledger_objects(values))
            for p, (_lo, hi) in spans.items():
                self._next[p] = max(self._next.get(p, 0), hi)
            return announced
