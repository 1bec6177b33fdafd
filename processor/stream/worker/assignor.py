"""The group's partition assignor: Faust's, with every worker given its share when the
partitions do not divide evenly among the workers.

Faust's copartitioned assignor is sticky: a worker keeps the partitions it holds up to a
capacity of ceil(partitions / workers), and with standby replicas on it trims nothing
below that capacity (faust-streaming issue 93; its fix applies to standby_replicas = 0
only). So with 4 timeline partitions, two workers holding 2 each and a third joining,
every worker is at its capacity of 2 and the third gets no partition, neither active nor
standby: it ingests but counts nothing and copies nothing, for as long as no other
rebalance reshuffles the group. The bench's 3-worker scale-out found that group in 2 of
14 joins, at a load average below 1 too; a third worker started after the other two
settled finds it every time.

`BalancedCopartitionedAssignor` takes Faust's assignment as it is and then evens it out,
one move at a time: first the active partitions, until no two workers' counts differ by
more than one (from the worker holding most to the one holding fewest, a partition the
taker keeps a standby copy of first: the copy becomes active, the giver keeps a copy),
then the standby copies, for as long as a worker holds two or more more than another
that may take one of them (not its active partition, not a copy it has). Every move
keeps Faust's rules (each partition active on one worker, standby on min(replicas,
workers - 1) others, never on its active holder) and lowers the sum of the squared
counts of its kind, so each loop ends; where Faust's assignment is even already nothing
moves. The choices depend on the member ids and partition numbers only, as Faust's do.
The changelogs follow their copartitioned timeline partitions and the global tables'
standbys are assigned as Faust assigns them.

`BalancedPartitionAssignor` is Faust's `PartitionAssignor` with its
`_perform_assignment` run unchanged but for the one name it looks up for the
copartitioned step (the function's code, with `CopartitionedAssignor` bound to the
balanced one in its globals: nothing of Faust's is copied or changed for other users).
"""

from __future__ import annotations

import types
from collections.abc import Callable, MutableMapping
from typing import Any

from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from faust.assignor.partition_assignor import PartitionAssignor


class BalancedCopartitionedAssignor(CopartitionedAssignor):
    """Faust's copartitioned assignor, then evened out: one assignment at a time moves
    from a worker holding most to one holding fewest, until no two differ by more than
    one, actives first, then standbys."""

    def get_assignment(self) -> MutableMapping[str, CopartitionedAssignment]:
        held = super().get_assignment()
        while self._move_active(held):
            pass
        while self._move_standby(held):
            pass
        return held

    @staticmethod
    def _ranked(held: MutableMapping[str, CopartitionedAssignment],
                active: bool) -> list[CopartitionedAssignment]:
        """Fewest held first, ties by member id (the same choice on every leader)."""
        return [a for _m, a in sorted(
            held.items(), key=lambda kv: (len(kv[1].get_assigned_partitions(active)), kv[0]))]

    def _move_active(self, held: MutableMapping[str, CopartitionedAssignment]) -> bool:
        """Move one active partition from the worker holding most to the one holding
        fewest, if they differ by two or more. A partition the taker keeps a standby copy
        of is taken first (its copy becomes the active one and the giver keeps a standby
        copy instead: no copy to restore, the partition's standby count unchanged)."""
        ranked = self._ranked(held, True)
        taker, giver = ranked[0], ranked[-1]
        if len(giver.actives) < len(taker.actives) + 2:
            return False
        copied = sorted(giver.actives & taker.standbys)
        partition = copied[0] if copied else min(giver.actives)
        giver.unassign_partition(partition, active=True)
        if copied:
            taker.unassign_partition(partition, active=False)
            giver.assign_partition(partition, active=False)
        taker.assign_partition(partition, active=True)
        return True

    def _move_standby(self, held: MutableMapping[str, CopartitionedAssignment]) -> bool:
        """Move one standby copy from a worker holding two or more copies more than
        another to that one, where the taker may hold it (not its active partition, not
        a copy it holds): the pair with the widest gap that has such a copy."""
        ranked = self._ranked(held, False)
        pairs = sorted(((g, t) for g in reversed(range(len(ranked))) for t in range(g)),
                       key=lambda gt: len(ranked[gt[1]].standbys) - len(ranked[gt[0]].standbys))
        for g, t in pairs:
            giver, taker = ranked[g], ranked[t]
            if len(giver.standbys) < len(taker.standbys) + 2:
                return False
            movable = sorted(p for p in giver.standbys if taker.can_assign(p, active=False))
            if movable:
                giver.unassign_partition(movable[0], active=False)
                taker.assign_partition(movable[0], active=False)
                return True
        return False


def _with_copartitioned(function: Callable[..., Any], assignor: type) -> Callable[..., Any]:
    """`function` with `CopartitionedAssignor` in its globals bound to `assignor`."""
    names = dict(function.__globals__, CopartitionedAssignor=assignor)
    bound = types.FunctionType(function.__code__, names, function.__name__,
                               function.__defaults__, function.__closure__)
    bound.__kwdefaults__ = function.__kwdefaults__
    bound.__qualname__ = function.__qualname__
    return bound


class BalancedPartitionAssignor(PartitionAssignor):
    """Faust's partition assignor with the balanced copartitioned step."""

    _perform_assignment = _with_copartitioned(
        PartitionAssignor._perform_assignment, BalancedCopartitionedAssignor)
