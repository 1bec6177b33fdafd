"""A third worker joining two that hold every timeline partition gets its share (real
broker, real workers, standby replicas on). With Faust's own assignor the two keep 2 of
the 4 partitions each, at their capacity, and the third gets none, for good
(worker/assignor.py). The members' ids name their processes (kafka_io.client_id)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.devtools.deployment import group_assignment

#: How long a group may take to give every member its partitions (a rebalance waits for
#: every member's next poll and the session timeout of a member that left).
SETTLE_S = 90.0
_COORDINATOR_NOT_READY = frozenset({KafkaError.NOT_COORDINATOR,
                                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def _settle(conf: dict[str, str], group: str, topic: str, members: int) -> list[list[int]]:
    """Wait until `members` members hold the same timeline partitions for 3 readings."""
    deadline = time.monotonic() + SETTLE_S
    seen: list[list[list[int]]] = []
    while time.monotonic() < deadline:
        try:
            held = sorted(group_assignment(conf, group, topic).values())
        except KafkaException as exc:
            # A fresh broker answers a new group's description with NOT_COORDINATOR
            # until its coordinator is loaded (not flagged retriable): no reading yet.
            if exc.args[0].code() not in _COORDINATOR_NOT_READY:
                raise
            held = []
        seen.append(held)
        if len(held) == members and sum(map(len, held)) == 4 and seen[-3:] == [held] * 3:
            return held
        time.sleep(1.0)
    return seen[-1] if seen else []


@pytest.mark.kafka
def test_a_third_worker_joining_two_gets_a_partition(
        deployment_factory: Callable[..., Any]) -> None:
    now = int(time.time() * 1000)
    dep = deployment_factory({f"c{i}": (now // 1000) * 1000 for i in range(8)},
                             name="assign", partitions=4, standby_replicas=1)
    conf, group, topic = dep.conf, dep.settings.app_id, dep.topics.timeline
    first = dep.worker.start()
    second = dep.add_worker("second").start()
    two = _settle(conf, group, topic, 2)
    assert [len(p) for p in two] == [2, 2], (two, first.log_tail(), second.log_tail())
    third = dep.add_worker("third").start()
    three = _settle(conf, group, topic, 3)
    assert sorted(len(p) for p in three) == [1, 1, 2], (three, third.log_tail())
    for w in (first, second, third):
        assert w.alive(), w.log_tail()
    # Each member id begins with its process's own client id (kafka_io.client_id): the
    # group's description tells the workers apart (Faust's default was one id for all).
    host = socket.gethostname()
    members = list(group_assignment(conf, group, topic))
    owners = [[w for w in (first, second, third)
               if m.startswith(f"dpc-{group}-{host}-{w.proc.pid}-")] for m in members]
    assert sorted(id(o[0]) for o in owners if len(o) == 1) == sorted(
        id(w) for w in (first, second, third)), members
