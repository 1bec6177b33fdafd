"""Local state that belongs to other topics: found at start, before Faust reads it.

A partition database of the state directory records the changelog offset it has applied
through (Faust's persisted offset). When that offset is at or past the end of its
changelog partition on the brokers, the database holds records the changelog never had:
the brokers were recreated (`deploy/kafka.py stop` deletes a local broker's data) or the
topic was deleted. Faust then stops the worker with a ConsistencyError traceback, or, when
the new changelog is empty, goes on silently from the stale state. Neither is rebuilt
here: the old topics' releases were drawn with this deployment's noise, so whether a fresh
start may follow is the operator's decision (a new noise key or new counter starts
make it a new computation, docs/state.md). `stale_databases` names each such database;
the worker turns the first into one `error:` line with the remedy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Options as RdictOptions
from rocksdict import Rdict

#: The key under which Faust's RocksDB store keeps a partition's persisted offset
#: (faust.stores.rocksdb.Store.offset_key).
OFFSET_KEY = b"__faust\0offset__"

#: A partition database's file name: `<table>-<partition>.db` (Faust's partition_path).
_DB_NAME = re.compile(r"^(?P<table>.+)-(?P<partition>\d+)\.db$")


@dataclass(frozen=True)
class StaleDatabase:
    """A database that has applied `persisted` on `topic`/`partition`, which ends at `end`
    (the next offset the brokers would give)."""

    path: Path
    topic: str
    partition: int
    persisted: int
    end: int


def persisted_offset(path: Path) -> int | None:
    """The changelog offset the database at `path` has applied through (None: none yet,
    or a database that cannot be opened: the worker's corruption check reports that)."""
    try:
        db = Rdict(str(path), options=RdictOptions(raw_mode=True))
    except Exception:  # rocksdict raises plain Exception("Corruption: ...")
        return None
    try:
        raw = db.get(OFFSET_KEY)
    finally:
        db.close()
    return None if raw is None else int(raw)


def stale_databases(tabledir: Path, changelog_of: Callable[[str], str],
                    ends: Callable[[str], Mapping[int, tuple[int, int]]]
                    ) -> list[StaleDatabase]:
    """The databases of `tabledir` whose persisted offset is at or past the end of their
    changelog partition. `changelog_of(table)` names a table's changelog topic and
    `ends(topic)` gives partition -> (low, high) watermarks; a topic or partition the
    brokers do not have counts as ending at 0."""
    found: list[StaleDatabase] = []
    watermarks: dict[str, Mapping[int, tuple[int, int]]] = {}
    for path in sorted(tabledir.glob("*.db")) if tabledir.is_dir() else ():
        name = _DB_NAME.match(path.name)
        if name is None:
            continue
        persisted = persisted_offset(path)
        if persisted is None:
            continue
        topic = changelog_of(name["table"])
        if topic not in watermarks:
            watermarks[topic] = ends(topic)
        partition = int(name["partition"])
        end = watermarks[topic].get(partition, (0, 0))[1]
        if persisted >= end:
            found.append(StaleDatabase(path, topic, partition, persisted, end))
    return found
