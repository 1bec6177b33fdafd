"""Released values and state bytes of a fixed key on a sparse stream, pinned.

The digests were computed with the SVT that drew its look-ahead one discrete Laplace
sample at a time; a faster sampler (or any other change of how draws are computed) must
reproduce them bit for bit: the same (counter, tick, value) releases and the same stored
bytes of every counter and partition value. (The state digests were re-pinned when the
input duplicate filter became per counter and the partitions recorded their privacy unit:
with the counters' filters and the partitions' `legacy_inputs` and `privacy_unit` left
out, the stored bytes hash to the earlier digests.)
"""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore

COUNTERS = 12
TICKS = 420
LAST_EVENT_TICK = 400


def run_sparse(mechanism: str, epsilon: float) -> tuple[list[tuple[str, int, float]], str]:
    """12 counters, 0-3 events per tick over 400 ticks (most ticks of a counter are ⊥),
    then markers only; one commit per tick. Returns the releases and a digest of the
    store's every key and value."""
    rng = random.Random(7)
    names = {f"c{c:03d}": 0 for c in range(COUNTERS)}
    s = with_overrides(Settings(), counters=names, partitions=1, mechanism=mechanism,
                       epsilon=epsilon, delta=1e-6, heartbeat_ticks=10**6, tick_ms=1000)
    store = DictStore()
    pub = CollectingSink()
    commit = BatchCommit(Operator(s, NoiseKey(bytes(range(32)))), store, pub)

    async def play() -> None:
        off = 0
        for n in range(TICKS):
            batch: list[tuple[int, bytes]] = []
            if 1 <= n <= LAST_EVENT_TICK:
                evs = [Event(f"c{rng.randrange(COUNTERS):03d}", n * 1000 + rng.randrange(1000),
                             UNIT, 0, off * 100 + j) for j in range(rng.randrange(4))]
                if evs:
                    batch.append((off, encode_batch(evs)))
                    off += 1
            batch.append((off, encode_marker(n)))
            off += 1
            await commit.commit(0, batch)

    asyncio.run(play())
    h = hashlib.sha256()
    for k, v in sorted(store.scan("")):
        h.update(k.encode())
        h.update(v)
    return [(r.counter, r.tick, r.value) for r in pub.releases], h.hexdigest()


@pytest.mark.parametrize(("mechanism", "epsilon", "n", "releases", "state"), [
    ("ecc", 500.0, 28, "e4dcdefa49fcf34fdb05e742796c98f2a438c7f97e24f0c766bda7700492e9d3",
     "19596c037a3ee0c3e571292102c97c0b212c20b76bb7bc896e501182bc9af6b5"),
    ("ecc", 5.0, 0, "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
     "7fd048571c989162d33e5171d3eb8c019f4705ff939a3b8ce5659421acacce7b"),
    ("simecc", 50.0, 96, "64fa8c3f8ed5e8ea0b239c3bd76a6fa56217f087046a782726251575f8150d46",
     "a2c4f12adf4fde2a717f69eab206bd6e9540197a6683cfdcfb66e7f9a0b20b37"),
])
def test_sparse_stream_releases_and_state_are_pinned(mechanism: str, epsilon: float, n: int,
                                                     releases: str, state: str) -> None:
    got, digest = run_sparse(mechanism, epsilon)
    assert len(got) == n
    assert hashlib.sha256(repr(got).encode()).hexdigest() == releases
    assert digest == state
    if mechanism == "ecc" and n:
        assert got[0] == ("c008", 100, 16.28460693359375)
