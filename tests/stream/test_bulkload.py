"""The bulk load on the broker (worker/bulkload.py; docs/state.md, "Restore"): a worker
restored from an empty state directory goes on as if it never stopped, and a load killed
halfway (kill -9 after its first write batch) then restarted is complete.

"Complete" is checked twice, on the production path: the published stream equals the
uninterrupted recomputation (replay, and nothing lost or counted twice: test_crash's
checks), and after the final clean stop every local partition database holds exactly the
monotone merge of its changelog partition (per key, the value with the highest offset
header), read back from RocksDB and the brokers.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options as RdictOptions
from rocksdict import Rdict

from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import changelog_topic
from processor.stream.model.state import stored_offset
from processor.stream.worker.bulkload import CHUNK_WRITTEN
from processor.stream.worker.stale import OFFSET_KEY
from tests.stream.test_app_e2e import (
    Live,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
)
from tests.stream.test_crash import COUNTERS, _drain_and_check, _produce_steadily

_LOADED = re.compile(r"bulk load: (\d+) changelog record\(s\) of (\d+) partition\(s\)")


def _databases(live: Live) -> dict[int, Path]:
    """partition -> the state table's local database of the first worker."""
    found = {}
    for path in Path(live.settings.state_dir).rglob("dpc-state-*.db"):
        found[int(path.name[len("dpc-state-"):-len(".db")])] = path
    return found


def _read_db(path: Path) -> tuple[dict[bytes, bytes], int | None]:
    db: Any = Rdict(str(path), options=RdictOptions(raw_mode=True))
    try:
        values = {bytes(k): bytes(v) for k, v in db.items() if bytes(k) != OFFSET_KEY}
        raw = db.get(OFFSET_KEY)
    finally:
        db.close()
    return values, None if raw is None else int(raw)


def _merged_changelog(live: Live) -> dict[int, dict[bytes, bytes]]:
    """partition -> key -> the value with the highest offset header among its changelog
    records (keys whose records are all deletions left out)."""
    out: dict[int, dict[bytes, bytes]] = {}
    for p, records in kafka_io.read_topic(live.conf, changelog_topic(live.settings)).items():
        best = out.setdefault(p, {})
        for r in records:
            if r.key is None or r.value is None:
                continue
            held = best.get(r.key)
            if held is None or (stored_offset(r.value) or -1) > (stored_offset(held) or -1):
                best[r.key] = r.value
    return out


def _loaded(log: str, group: int = 1) -> list[int]:
    """The record counts (`group` 2: partition counts) of every `bulk load` line of a
    worker's log, in order."""
    return [int(m.group(group)) for m in _LOADED.finditer(log)]


def _released(factory: Callable[..., Live], name: str) -> tuple[Live, int, int]:
    """A deployment of COUNTERS on 100 ms ticks, started and past its first release:
    (it, its start, its tick)."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = factory(dict.fromkeys(COUNTERS, start), name=name, epsilon=500.0,
                   lateness_ms=400, checkpoint_ms=500)
    live.worker.start()
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    return live, start, tick


def _flowing(live: Live, seconds: float, seed: int) -> tuple[threading.Thread,
                                                              threading.Event, list[int]]:
    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=_produce_steadily,
                                args=(live, seconds, seed, stop, sent), daemon=True)
    producer.start()
    return producer, stop, sent


def _check_databases_complete(live: Live) -> int:
    """After a clean stop: every local database equals the merge of its changelog
    partition; returns how many keys were compared."""
    merged = _merged_changelog(live)
    dbs = _databases(live)
    assert set(dbs) == set(merged), (sorted(dbs), sorted(merged))
    n = 0
    for p, path in dbs.items():
        values, persisted = _read_db(path)
        assert persisted is not None
        assert values == merged[p], f"partition {p}: the database is not the changelog's merge"
        n += len(values)
    assert n > len(COUNTERS)
    return n


@pytest.mark.kafka
def test_restore_from_an_empty_state_dir_equals_never_stopping(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """Events flow; kill -9; the state directory is deleted; a fresh worker bulk-loads the
    changelog (its log says how many records, more than zero) and goes on: nothing lost,
    nothing counted twice, the releases equal the uninterrupted recomputation, and each
    database equals its changelog's merge."""
    live, start, tick = _released(live_factory, "bulk-fresh")
    producer, stop, sent = _flowing(live, 12.0, 31)
    try:
        stop.wait(5.0)  # events flow for a while before the kill (a schedule, not a sync)
        live.worker.kill()
        shutil.rmtree(live.settings.state_dir)
        live.worker.start()
    finally:
        producer.join(timeout=60)
        stop.set()
    report = _drain_and_check(live, start, tick, sent[0])
    loaded = _loaded(live.worker.log_tail(2000))
    assert len(loaded) == 2 and loaded[0] == 0 and loaded[1] > 0, loaded
    keys = _check_databases_complete(live)
    print(f"fresh restore: {sent[0]} events, bulk load {loaded[1]} records, {keys} keys "
          f"equal to the changelog's merge, {report.recomputed} releases identical")


@pytest.mark.kafka
@pytest.mark.parametrize("action,exit_code", [("kill", -9), ("term", 143)])
def test_a_bulk_load_killed_halfway_then_restarted_is_complete(
        live_factory: Callable[..., Live], action: str,  # noqa: F811
        exit_code: int) -> None:
    """Events flow; kill -9 (the next start discards the databases and loads them all);
    that start is ended by its own crash point after the load's first write batch, by
    SIGKILL, or by SIGTERM (an operator's stop request: exit 143, and the running flag
    stays absent as at a kill; before, a stop there made the next start discard every
    database and load them all again): one partition loaded, the other not (control,
    read from the databases); the next start keeps the loaded partition and reads only
    the rest (its load reads fewer records than there are), and the worker goes on: the
    same checks as after a fresh restore."""
    live, start, tick = _released(live_factory, f"bulk-half-{action}")
    producer, stop, sent = _flowing(live, 16.0, 37)
    try:
        stop.wait(5.0)  # events flow for a while before the kill (a schedule, not a sync)
        live.worker.kill()
        suffix = "" if action == "kill" else f":{action}"
        live.worker.env["DPC_TEST_CRASH_AT"] = f"{CHUNK_WRITTEN}:1{suffix}"
        live.worker.start()
        code, log = live.worker.wait_exit(tail=400)
        assert code == exit_code, log
        assert f"test crash point {CHUNK_WRITTEN} reached" in log, log
        persisted = {p: _read_db(path)[1] for p, path in _databases(live).items()}
        assert sorted(v is None for v in persisted.values()) == [False, True], persisted
        del live.worker.env["DPC_TEST_CRASH_AT"]
        live.worker.start()
    finally:
        producer.join(timeout=60)
        stop.set()
    report = _drain_and_check(live, start, tick, sent[0])
    log = live.worker.log_tail(3000)
    loaded = _loaded(log)
    # The first start loaded nothing, the killed one logged no line, the last read only
    # the partition the killed load had not written (no worker wrote the changelog in
    # between, so the other was loaded through its end).
    assert len(loaded) == 2 and loaded[0] == 0 and loaded[1] > 0, loaded
    assert _loaded(log, 2)[1] == 1, log
    keys = _check_databases_complete(live)
    print(f"load killed halfway: {sent[0]} events, resumed load {loaded[1]} records "
          f"(persisted before: {persisted}), {keys} keys equal to the changelog's merge, "
          f"{report.recomputed} releases identical")


def test_the_start_loads_the_tables_of_the_workers_stages(tmp_path: Path) -> None:
    """The start loads `state_tables` before the worker's stages exist: in both privacy
    modes they name exactly the stages' tables and changelogs (a stage the load did not
    know of would be restored by Faust's recovery alone, a record at a time)."""
    from processor.core.rng import NoiseKey
    from processor.stream.kafka.topics import STATE_TABLE, UNITS_TABLE, state_tables
    from processor.stream.model.config import Settings, with_overrides, with_unit
    from processor.stream.worker.app import Worker

    event = with_overrides(Settings(), counters={"a": 0}, state_dir=str(tmp_path),
                           metrics_port=0, app_id="tables-event")
    user = with_unit(with_overrides(event, app_id="tables-user"), 1.0, 1e-6, 2, 2)
    for s, names in ((event, {STATE_TABLE}), (user, {STATE_TABLE, UNITS_TABLE})):
        worker = Worker(s, NoiseKey.from_seed(1))
        staged = {st.table.name: st.changelog for st in worker.stages}
        assert staged == state_tables(s) and set(staged) == names, (staged, s.privacy_unit)
