"""The noise key bound to its state.

Before, a worker restarted on existing state with a fresh key file ran on silently: later
releases mixed fresh noise with old and disagreed with replay under the original key. Now
the partition and counter values carry the key's public fingerprint and the operator
refuses any other key before anything of the record is published.

Without a broker: the operator refuses another key on a partition value and on a counter
value (the latter also when the partition value is missing: a crash inside the first
batch), hides an undeclared counter's name, and refuses state of version 2 (no
fingerprint) naming the version. With a broker: a worker runs, stops, is restarted with a
fresh key file: exit 2, one `error:` line naming both fingerprints and the remedy, nothing
published; control: the original key restarts and publishes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.devtools.deployment import write_config
from processor.keyfile import read_key, write_key
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import KeyMismatchError, Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore, StateVersionError, partition_key
from tests.stream.helpers import apply_now
from tests.stream.refusals import public_records, ran_and_stopped, refused

TICK = 1000
KEY = NoiseKey(hashlib.sha256(b"key binding test key (public, tests only)").digest())
OTHER = NoiseKey(hashlib.sha256(b"a fresh key file").digest())


def settings(**kw: Any) -> Settings:
    fields: dict[str, Any] = dict(counters={"a": 0}, tick_ms=TICK, heartbeat_ticks=1,
                                  heartbeat_spread=False, epsilon=500.0, partitions=1)
    fields.update(kw)
    return with_overrides(Settings(), **fields)


def run(op: Operator, store: DictStore, ticks: range, offset: int = 0) -> Output:
    """One event of `a` and one marker per tick, at offsets from `offset`."""
    out = Output()
    for i, n in enumerate(ticks):
        apply_now(op, store, 0, offset + 2 * i,
                 encode_batch([Event("a", n * TICK, UNIT, 0, offset + 2 * i)]), out)
        apply_now(op, store, 0, offset + 2 * i + 1, encode_marker(n), out)
    return out


def test_another_key_is_refused_on_existing_state_before_anything_is_published() -> None:
    s = settings()
    store = DictStore()
    first = run(Operator(s, KEY), store, range(10))
    assert len(first.releases) == 10 and [e.key_id for e in first.ledger] == [
        KEY.fingerprint()]
    before = dict(store.data)
    for record in (encode_marker(10), encode_batch([Event("a", 10 * TICK, UNIT, 0, 20)])):
        out = Output()
        with pytest.raises(KeyMismatchError) as info:
            apply_now(Operator(s, OTHER), store, 0, 20, record, out)
        msg = str(info.value)
        assert (f"fingerprint {KEY.fingerprint()}" in msg
                and f"fingerprint is {OTHER.fingerprint()}" in msg), msg
        assert "'p/0'" in msg and "new deployment" in msg, msg
        assert out.releases == [] and out.ledger == [] and store.data == before
    # Control: the original key continues, in a fresh process (nothing cached).
    more = run(Operator(s, KEY), store, range(10, 13), offset=20)
    assert [r.tick for r in more.releases] == [11, 12, 13]


def test_a_counter_value_is_bound_too() -> None:
    """The partition value is missing (a crash inside a partition's first batch writes the
    counters first): the partition adopts whatever key comes, but the counter value still
    names its own key, and the first record that touches it is refused. An undeclared
    counter's name (private until announced) is not in the message."""
    for s, name in ((settings(), "'c/a'"),
                    (settings(allow_undeclared=True, counters={"b": 0}),
                     "'c/(an undeclared counter)'")):
        store = DictStore()
        run(Operator(s, KEY), store, range(3))
        del store.data[partition_key(0)]
        with pytest.raises(KeyMismatchError, match=re.escape(name)) as info:
            run(Operator(s, OTHER), store, range(3, 4), offset=6)
        assert "'b'" not in str(info.value)
        # Control: the key the counter was made with.
        run(Operator(s, KEY), store, range(3, 4), offset=6)


def test_state_of_version_2_is_refused_naming_the_version() -> None:
    """Values written before the key fingerprint was stored cannot be verified against
    any key: refused (StateVersionError, with its store key), never adopted."""
    s = settings()
    store = DictStore()
    run(Operator(s, KEY), store, range(3))
    raw = store.data[partition_key(0)]
    assert raw[:4] == b"DPP\x04"
    fields = orjson.loads(raw[12:])
    store.data[partition_key(0)] = b"DPP\x02" + orjson.dumps(fields[:-1])
    with pytest.raises(StateVersionError, match="version 2") as info:
        run(Operator(s, KEY), store, range(3, 4), offset=6)
    assert info.value.key == "p/0"
    # What the worker prints (after "error: "): the key, the version, the remedy; it is
    # not called corrupt (restoring it from the changelog would not help).
    from processor.stream.worker.app import CorruptStateError

    msg = str(CorruptStateError(info.value, s))
    assert msg.startswith("the stored state under key 'p/0' is an operator partition state "
                          "of format version 2"), msg
    assert "new deployment" in msg and "corrupt" not in msg, msg


# --------------------------------------------------------------------------- the broker


@pytest.mark.kafka
def test_restart_with_a_fresh_key_file_is_refused(
        deployment_factory: Callable[..., Any]) -> None:
    """A key swapped under existing state, against the real broker and worker: run, stop, restart
    with a fresh key file: exit 2, one `error:` line naming the stored and the given
    fingerprint and the remedy, no traceback, nothing published. Control: the original
    key file restarts and publishes."""
    dep = ran_and_stopped(deployment_factory, "keybind")
    worker = dep.worker
    ledger, counts = public_records(dep)

    fresh = write_key(dep.directory / "fresh.key")
    given = read_key(str(fresh), "hex").fingerprint()
    stored = dep.key.fingerprint()
    assert given != stored
    write_config(with_overrides(dep.settings, noise_key_file=str(fresh)), dep.config)
    worker.start()
    error, log = refused(worker)
    assert error.startswith("error: noise key: the state under key 'p/0'"), log
    assert f"fingerprint {stored}" in error and f"is {given}" in error, log
    assert "new deployment" in error, log
    assert public_records(dep) == (ledger, counts)

    # Control: the key the state was made with.
    write_config(dep.settings, dep.config)
    worker.start()
    dep.wait_releases(lambda rs: len(rs) >= len(counts) + 2, timeout_s=120)
    assert worker.stop() == 0, worker.log_tail()
