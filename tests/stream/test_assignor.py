"""The group's partition assignor (worker/assignor.py), pure: Faust's copartitioned
assignor leaves a worker that joins two workers at their capacity with nothing when the
partitions do not divide evenly (the control below shows it); the balanced one gives
every worker its share, active and standby, under random prior assignments, changes
nothing where Faust's assignment is even, and keeps Faust's rules: each partition active
once, standby on min(replicas, workers - 1) others, never on its active holder."""

from __future__ import annotations

import random
from collections.abc import MutableMapping

from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from faust.assignor.partition_assignor import PartitionAssignor

from processor.stream.worker.assignor import (
    BalancedCopartitionedAssignor,
    BalancedPartitionAssignor,
)

Held = MutableMapping[str, CopartitionedAssignment]


def _joined_two_at_capacity() -> Held:
    """Two workers holding 2 of 4 partitions each (a standby copy of the other's) and a
    third that just joined."""
    return {"a": CopartitionedAssignment({2, 3}, {0, 1}, {"timeline"}),
            "b": CopartitionedAssignment({0, 1}, {2, 3}, {"timeline"}),
            "c": CopartitionedAssignment(set(), set(), {"timeline"})}


def _counts(held: Held, active: bool) -> list[int]:
    return sorted(len(a.get_assigned_partitions(active)) for a in held.values())


def _check_rules(held: Held, partitions: int, replicas: int) -> None:
    replicas = min(replicas, len(held) - 1)
    for p in range(partitions):
        assert sum(p in a.actives for a in held.values()) == 1
        assert sum(p in a.standbys for a in held.values()) == replicas
    for a in held.values():
        assert not a.actives & a.standbys


def _check_shares(held: Held, partitions: int, replicas: int) -> None:
    n = len(held)
    for active, per in ((True, 1), (False, min(replicas, n - 1))):
        total = partitions * per
        counts = _counts(held, active)
        assert sum(counts) == total
        assert all(total // n <= c <= -(-total // n) for c in counts), (active, counts)


def test_a_third_worker_gets_its_share() -> None:
    held = BalancedCopartitionedAssignor(
        {"timeline"}, _joined_two_at_capacity(), num_partitions=4, replicas=1).get_assignment()
    _check_rules(held, 4, 1)
    assert _counts(held, True) == [1, 1, 2] and _counts(held, False) == [1, 1, 2]
    # Sticky: one active and one standby copy moved to the third worker, nothing else.
    before = _joined_two_at_capacity()
    moved = sum(len(held[m].actives - before[m].actives)
                + len(held[m].standbys - before[m].standbys) for m in held)
    assert moved == 2 and len(held["c"].actives) == len(held["c"].standbys) == 1
    # Control: Faust's own assignor leaves the third worker with nothing.
    faust = CopartitionedAssignor(
        {"timeline"}, _joined_two_at_capacity(), num_partitions=4, replicas=1).get_assignment()
    assert faust["c"].actives == set() and faust["c"].standbys == set()


def test_shares_and_rules_hold_under_random_prior_assignments() -> None:
    rng = random.Random(20261206)
    for _ in range(2000):
        partitions = rng.randint(1, 12)
        n = rng.randint(1, 5)
        replicas = rng.randint(0, 2)
        held: Held = {}
        for i in range(n):
            # Any prior state, zombies' duplicates included.
            actives = {p for p in range(partitions) if rng.random() < 0.4}
            standbys = {p for p in range(partitions) if rng.random() < 0.3} - actives
            held[f"m{i}"] = CopartitionedAssignment(actives, standbys, {"timeline"})
        done = BalancedCopartitionedAssignor(
            {"timeline"}, held, num_partitions=partitions, replicas=replicas).get_assignment()
        _check_rules(done, partitions, replicas)
        if partitions >= n:
            _check_shares(done, partitions, replicas)


def test_where_fausts_assignment_is_even_it_is_the_assignment() -> None:
    rng = random.Random(7)
    even = 0
    for _ in range(500):
        partitions, n, replicas = rng.randint(1, 12), rng.randint(1, 4), rng.randint(0, 2)
        prior = [({p for p in range(partitions) if rng.random() < 0.4},
                  {p for p in range(partitions) if rng.random() < 0.3}) for _ in range(n)]

        def fresh(prior: list[tuple[set[int], set[int]]] = prior) -> Held:
            return {f"m{i}": CopartitionedAssignment(set(a), set(s) - a, {"timeline"})
                    for i, (a, s) in enumerate(prior)}
        faust = CopartitionedAssignor({"timeline"}, fresh(), num_partitions=partitions,
                                      replicas=replicas).get_assignment()
        if any(max(c) - min(c) > 1 for c in (_counts(faust, True), _counts(faust, False))):
            continue
        even += 1
        ours = BalancedCopartitionedAssignor({"timeline"}, fresh(), num_partitions=partitions,
                                             replicas=replicas).get_assignment()
        assert {m: (a.actives, a.standbys) for m, a in ours.items()} == {
            m: (a.actives, a.standbys) for m, a in faust.items()}
    assert even > 100  # the comparison ran


def test_the_partition_assignor_runs_fausts_step_with_the_balanced_one() -> None:
    faust_step = PartitionAssignor._perform_assignment
    ours = BalancedPartitionAssignor._perform_assignment
    assert "CopartitionedAssignor" in faust_step.__code__.co_names
    assert ours.__code__ is faust_step.__code__
    assert ours.__globals__["CopartitionedAssignor"] is BalancedCopartitionedAssignor
    assert faust_step.__globals__["CopartitionedAssignor"] is CopartitionedAssignor
