"""Pure: a worker cut off from the brokers while it keeps running (a
"zombie") may apply, publish and write state after the group gave its partition to
another worker. Its writes land in the changelog after the new owner's. With the
monotone rule (state.supersedes), every later owner restores the newest state and
every published (counter, tick, kind) has one value, the one an uninterrupted run
publishes. Control: the same history restored by "the later write wins" (what a plain
compacted changelog does) is caught. No Kafka: the changelog is a list, the owners are
operators over stores rebuilt from it (the broker test is tests/reliability).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import pytest

from processor.core import registry
from processor.stream.model.commit import BatchCommit
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import Release
from processor.stream.model.state import DictStore, supersedes
from tests.stream.test_operator import KEY, TICK, random_timeline, settings, to_records

Changelog = list[tuple[str, bytes | None]]
Rule = Callable[[bytes | None, bytes | None], bool]


class LoggedStore(DictStore):
    """A worker's local store whose writes also go to a changelog (held back while the
    worker is cut off)."""

    def __init__(self, data: dict[str, bytes], log: Changelog) -> None:
        super().__init__()
        self.data = dict(data)
        self.log = log

    def set(self, key: str, value: bytes) -> None:
        super().set(key, value)
        self.log.append((key, value))

    def delete(self, key: str) -> None:
        super().delete(key)
        self.log.append((key, None))


K = TypeVar("K", bound=Hashable)


def restore(log: Iterable[tuple[K, bytes | None]], rule: Rule) -> dict[K, bytes]:
    """A store rebuilt from the changelog by `rule` (the standby / restore path)."""
    data: dict[K, bytes] = {}
    for key, value in log:
        if rule(value, data.get(key)):
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
    return data


def later_wins(new: bytes | None, old: bytes | None) -> bool:
    return True


class Subscriber:
    """The private-count topic as a subscriber sees it: a second, different value for a
    (counter, tick, kind) is recorded as a conflict."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int, str], float] = {}
        self.conflicts = 0

    def take(self, releases: list[Release]) -> None:
        for r in releases:
            got = self.seen.setdefault((r.counter, r.tick, r.kind), r.value)
            self.conflicts += got != r.value


class Held:
    """A publisher whose records reach the subscriber only at `release()` (a worker's
    socket during a blackhole, delivered after the heal)."""

    def __init__(self, sub: Subscriber, held: bool) -> None:
        self.sub = sub
        self.held = held
        self.pending: list[Release] = []

    def send(self, out: Output) -> None:
        if self.held:
            self.pending.extend(out.decoded_releases())
        else:
            self.sub.take(out.decoded_releases())

    async def flush(self) -> None:
        return None

    def release(self) -> None:
        self.sub.take(self.pending)
        self.pending.clear()


def run_owner(s: Any, data: dict[str, bytes], log: Changelog, records: list[bytes],
              start: int, end: int, pub: Held, checkpoint_every: int
              ) -> tuple[int, dict[str, bytes]]:
    """An owner restored with `data` applies records[start:end], one record per batch,
    a checkpoint every `checkpoint_every` records; returns the offset the consumer group
    would have committed (the first record after its last checkpoint) and its store."""
    store = LoggedStore(data, log)
    bc = BatchCommit(Operator(s, KEY, factory=registry), store, pub)
    committed = start
    for off in range(start, end):
        asyncio.run(bc.apply(0, [(off, records[off])]))
        if (off + 1 - start) % checkpoint_every == 0 or off + 1 == len(records):
            asyncio.run(bc.checkpoint())
            committed = off + 1
    return committed, store.data


def history(seed: int, rule: Rule) -> tuple[Subscriber, dict[str, bytes], dict[str, Any]]:
    """A's life, cut off at `cut`, still working (held) to `zombie_end`; B from A's last
    committed offset past `zombie_end`; A's held writes and releases land; C restores and
    runs to the end. Returns the subscriber, C's final state and figures."""
    rng = random.Random(seed)
    s = settings({f"c{i}": 100 * TICK for i in range(6)}, mechanism="ecc", epsilon=50.0,
                 heartbeat_ticks=4)
    records = to_records(random_timeline(rng, [f"c{i}" for i in range(6)], 100, 70, 0.5), 3)
    n = len(records)
    sub = Subscriber()
    log: Changelog = []
    cut = rng.randrange(n // 5, n // 3)
    zombie_end = rng.randrange(cut + 5, n // 2)
    a_committed, _ = run_owner(s, {}, log, records, 0, cut, Held(sub, False), 3)
    # A keeps going, cut off: its changelog writes and releases wait in its sockets.
    a_log: Changelog = []
    a_pub = Held(sub, True)
    a_local = restore(log, supersedes)
    run_owner(s, a_local, a_log, records, cut, zombie_end, a_pub, 2)
    # B restores what reached the changelog and re-applies from A's committed offset.
    b_end = rng.randrange(zombie_end + 5, 3 * n // 4)
    b_committed, _ = run_owner(s, restore(log, rule), log, records, a_committed, b_end,
                            Held(sub, False), 4)
    # The heal: A's writes land after B's, its releases reach subscribers.
    log.extend(a_log)
    a_pub.release()
    # C restores from the changelog and finishes.
    _, final = run_owner(s, restore(log, rule), log, records, b_committed, n,
                         Held(sub, False), 5)
    return sub, final, {"records": n, "cut": cut, "zombie_end": zombie_end, "b_end": b_end}


def clean(seed: int) -> tuple[Subscriber, dict[str, bytes]]:
    rng = random.Random(seed)
    s = settings({f"c{i}": 100 * TICK for i in range(6)}, mechanism="ecc", epsilon=50.0,
                 heartbeat_ticks=4)
    records = to_records(random_timeline(rng, [f"c{i}" for i in range(6)], 100, 70, 0.5), 3)
    sub = Subscriber()
    _, final = run_owner(s, {}, [], records, 0, len(records), Held(sub, False), 1)
    return sub, final


@pytest.mark.parametrize("seed", range(1, 7))
def test_a_zombie_s_late_writes_and_releases_change_nothing(seed: int) -> None:
    """Every value published equals the uninterrupted run's, none twice with two values,
    none missing; the last owner's state is the uninterrupted run's (nothing went back)."""
    sub, final, figures = history(seed, supersedes)
    ref, ref_final = clean(seed)
    assert sub.conflicts == 0, figures
    assert sub.seen == ref.seen, figures
    assert final == ref_final, figures


def test_later_write_wins_is_caught() -> None:
    """Control: restoring by arrival order lets the zombie's older state win, and some
    seed then publishes a value that differs from the uninterrupted run (or a second
    value for a published key), or ends in another state (events lost)."""
    caught = 0
    for seed in range(1, 7):
        sub, final, _ = history(seed, later_wins)
        ref, ref_final = clean(seed)
        caught += sub.conflicts > 0 or sub.seen != ref.seen or final != ref_final
    assert caught >= 4
