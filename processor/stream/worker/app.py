"""The worker process: a thin Faust shell around the commit protocol (the only module of
the project that runs Faust).

One `Worker` holds:

- the ingest stage (`ingest.Ingest`, confluent-kafka, in a thread of this process):
  input topic -> timeline topic (event batches per partition) or dead-letter topic;
- the operator agent: each timeline message -> `commit.BatchCommit.commit(partition,
  [(offset, value)])` on a Faust table (RocksDB via rocksdict, changelogged to Kafka), with
  the worker's producer for the private-count and ledger topics (`KafkaSink`);
- the leader's timer: appends "sealed through n" markers to every timeline partition once
  tick n's end plus the allowed lateness has passed on the wall clock, cross-checked
  against the brokers' clock (`clock.ClockGuard`, shared with ingest; docs/time.md);
- a timer that logs aggregate metrics.

The commit protocol (releases acknowledged before any state write; the order of the state
writes; what a crash at each step leaves) is documented in `commit.py`, its one home.
Faust-specific defences: `acks.GapGuard` re-reads timeline records Faust skipped around
a rebalance (acks.py), after an unclean stop the local RocksDB files are discarded and
rebuilt from the changelog, since they may hold writes the changelog never received, and
a process suspended past the session timeout exits before it publishes or writes state
(`fencing.SuspensionFence`): its partitions have moved meanwhile.

The dead-letter topic is the only place raw input bytes appear (base64, truncated): it is a
private topic, like the input. The private-count and ledger topics are public.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import faust
from confluent_kafka import KafkaError, KafkaException
from faust.exceptions import ConsumerNotStarted, NotReady
from faust.types import Message, TransportT
from rocksdict import Options as RdictOptions
from rocksdict import Rdict

from processor.commandline import CommandParser
from processor.core.errors import NoiseKeyError, StateFormatError
from processor.core.rng import KEY_FORMATS, NoiseKey
from processor.errors import RefusedError, StreamError, print_error
from processor.stream.kafka import kafka_io
from processor.stream.kafka.ingest import Ingest
from processor.stream.kafka.producer import AsyncProducer, DeliveryError, KafkaSink
from processor.stream.kafka.topics import (
    STATE_TABLE,
    UNITS_TABLE,
    changelog_topic,
    retention_required,
    state_tables,
    table_changelog,
    topic_name,
    units_changelog_topic,
    units_topic,
)
from processor.stream.model import lifetime
from processor.stream.model.bounding import unit_key
from processor.stream.model.clock import (
    PROBE_RECORD,
    ClockGuard,
    Stamp,
    next_marker,
)
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import ConfigError, Settings, load_noise_key, load_settings
from processor.stream.model.families import family_of
from processor.stream.model.faults import NO_FAULTS, FaultPlan
from processor.stream.model.lifetime import UnitClaim
from processor.stream.model.logs import LOG_FORMATS, configure_logging
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.provenance import ConfiguredProvenance
from processor.stream.model.records import (
    Announced,
    encode_marker,
    marker_tick,
    sealed_through,
)
from processor.stream.model.state import COUNTER_PREFIX, PARTITION_PREFIX, StateVersionError
from processor.stream.worker import transport
from processor.stream.worker.assignor import BalancedPartitionAssignor
from processor.stream.worker.bulkload import LoadResult, LocalDatabaseError, bulk_load
from processor.stream.worker.fencing import FENCED_EXIT, SuspensionFence
from processor.stream.worker.heap import FULL_COLLECTION_S, OldGeneration
from processor.stream.worker.ledger_tail import LedgerTail
from processor.stream.worker.metrics import Surface, WorkerMetrics
from processor.stream.worker.recovery import BatchedTableManager
from processor.stream.worker.stage import StageShell
from processor.stream.worker.stale import stale_databases
from processor.stream.worker.table import WorkerStores
from processor.stream.worker.timers import periodic
from processor.stream.worker.transport import QuickPollTransport
from processor.stream.worker.unit_stage import UnitStage

log = logging.getLogger("processor.stream.app")
#: The worker's start and ready lines: INFO records that show at the default level
#: (main_worker sets its level), naming only public things (app id, brokers,
#: parameters, counts of counters and partitions), never a value.
lifecycle = logging.getLogger("processor.stream.lifecycle")

#: A file in state_dir that exists while a worker runs; found at start => unclean stop.
RUNNING_FLAG: Final = "WORKER_RUNNING"
#: How often the metrics summary (aggregate counts only) is logged.
METRICS_LOG_S: Final = 30.0
#: How often the worker looks whether it is ready, until it wrote its ready line.
READY_CHECK_S: Final = 0.5
#: Timeline records per read when a worker looks back for the last marker appended.
MARKER_LOOKBACK: Final = 2000
#: How long the start waits for the brokers' requests (metadata, topic creation, the
#: ledger) before it gives up with an error.
BROKER_WAIT_S: Final = 15.0
#: The least rate (entries/s) at which the start reads the ledger: it waits BROKER_WAIT_S
#: plus the ledger's entries at this rate (a million counters have a million entries).
LEDGER_READ_RATE: Final = 5_000
#: How long the start waits for the brokers to answer at all: "no broker" within seconds
#: (a supervisor restarts the worker while the brokers come up).
BROKER_PROBE_S: Final = 5.0
#: A process suspended longer than this may have lost its partitions (the session
#: timeout less heartbeats and margin): it exits before it publishes or writes state.
SUSPENSION_LIMIT_S: Final = kafka_io.SESSION_TIMEOUT_S / 2


class StartError(StreamError, RuntimeError):
    """Why the worker cannot start: printed as one `error:` line, exit code 2."""


class StorageError(StreamError, RuntimeError):
    """A local state file the worker cannot use: one `error:` line, exit code 1 (a
    supervisor restarts it; the restart rebuilds the local state from the changelog)."""


#: Free space the state directory's disk must keep: RocksDB stalls, not fails, when a
#: flush finds no room, so the worker checks before it writes (at start and at every
#: checkpoint) and stops with a clear line instead of hanging.
MIN_FREE_BYTES: Final = 64 << 20

_CORRUPT_FILE = re.compile(r"(/[^\s]+?\.(?:sst|log|ldb)|MANIFEST-\d+|CURRENT)\b")

#: The kinds RocksDB's errors begin with (`rocksdb::Status::ToString`), raised by rocksdict
#: as a bare Exception: fixed words, safe to log, unlike the rest of the text (a path, a
#: key).
ROCKSDB_KINDS: Final = ("NotFound", "Corruption", "Not implemented", "Invalid argument",
                        "IO error", "Merge in progress", "Result incomplete",
                        "Shutdown in progress", "Operation timed out", "Operation aborted",
                        "Resource busy", "Operation expired", "Operation failed. Try again.",
                        "Compaction too large", "Column family dropped")


def failure_name(exc: BaseException) -> str:
    """A failure as the log names it: its type, and for an error of RocksDB the kind its
    text begins with (`ROCKSDB_KINDS`), never the rest of the text."""
    name = type(exc).__name__
    if type(exc) is Exception:
        text = str(exc)
        for kind in ROCKSDB_KINDS:
            if text.startswith(kind + ": "):
                return f"{name}: RocksDB {kind}"
    return name


def storage_failure(exc: BaseException, settings: Settings) -> str | None:
    """One line for a failure of the local state directory: the cause, the path and the
    remedy; None if `exc` is not one. RocksDB reports as `Exception("IO error: ...")` or
    `("Corruption: ...")`; only the kind and a file name are quoted (never the text,
    which could carry a key)."""
    where = Path(settings.state_dir).resolve() / settings.app_id
    rebuild = (f"the restart rebuilds the local state from the changelog topic "
               f"{changelog_topic(settings)!r} and loses nothing")
    err = exc.errno if isinstance(exc, OSError) else None
    text = "" if isinstance(exc, OSError) else str(exc)
    if err == errno.ENOSPC or "No space left on device" in text:
        free = _free_mib(where)
        return (f"the disk of the state directory {str(where)!r} is full ({free} free). "
                f"Remedy: free space on it (keep at least {MIN_FREE_BYTES >> 20} MiB) or "
                f"set state_dir to another disk, then restart: {rebuild}.")
    if err in (errno.EROFS, errno.EACCES, errno.EPERM) or any(
            m in text for m in ("Read-only file system", "Permission denied")):
        return (f"the state directory {str(where)!r} cannot be written (read-only or "
                "permission denied). Remedy: make it writable by the worker's user or set "
                f"state_dir to a writable directory, then restart: {rebuild}.")
    if text.startswith("Corruption:") or "Corruption:" in text:
        found = _CORRUPT_FILE.search(text)
        name = f" ({Path(found.group(1)).name})" if found else ""
        return (f"a local state file under {str(where)!r}{name} is corrupt. Remedy: "
                f"restart: {rebuild} (it discards the local files after this stop); if it "
                "happens again, check that disk.")
    return None


def _free_mib(path: Path) -> str:
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            return f"{shutil.disk_usage(p).free >> 20} MiB"
    return "unknown"


def check_free_space(settings: Settings) -> None:
    """Raise OSError(ENOSPC) when the state directory's disk has less than MIN_FREE_BYTES."""
    path = Path(settings.state_dir)
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return  # not there yet: _prepare_state_dir makes it, and says why if it cannot
    if free < MIN_FREE_BYTES:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))


class CorruptStateError(RuntimeError):
    """A stored value the operator cannot decode (a StateFormatError, with its store key):
    the message names the key and what an operator can do. A counter's name is shown only
    when declared (public); an undeclared one is private input until announced."""

    def __init__(self, exc: StateFormatError, settings: Settings) -> None:
        key = exc.key or "(unknown key)"
        if key.startswith("c/") and key[2:] not in settings.counters:
            key = "c/(an undeclared counter)"
        self.key = key
        if isinstance(exc, StateVersionError):
            super().__init__(
                f"the stored state under key {key!r} is {exc}. Remedy: finish this "
                "deployment with the release that wrote its state, or start a new "
                "deployment (new app_id and new private-count and ledger topics) with "
                "this one.")
            return
        super().__init__(
            f"the stored state under key {key!r} is corrupt ({exc}). Remedy: restore the "
            f"state from its changelog topic {changelog_topic(settings)!r} (delete the "
            f"local state directory {settings.state_dir!r} and restart: the worker "
            "rebuilds it from the changelog); if the changelog itself holds the corrupt "
            "value, start a new deployment (new app_id and new private-count and ledger "
            "topics).")


#: How far behind what the clocks allow a non-leader lets its partitions' seal fall
#: before it appends markers itself (`backup_due`).
BACKUP_SEAL_S: Final = 2.0


def marker_interval_s(settings: Settings) -> float:
    """How often the marker timer looks whether a tick can be sealed: a quarter of a tick,
    within 0.1-0.5 s (a marker is appended about this late after its tick's end plus
    the lateness)."""
    return max(0.1, min(0.5, settings.tick_ms / 4000.0))


def backup_due(frontiers: Mapping[int, int], allowed: int, settings: Settings) -> bool:
    """Whether a worker that is not the group's leader should append markers: it holds
    timeline partitions, markers were applied on each, and the least sealed of them is
    more than BACKUP_SEAL_S of ticks behind `allowed` (what the clocks allow sealing)."""
    if not frontiers:
        return False
    behind = max(1, math.ceil(BACKUP_SEAL_S * 1000 / settings.tick_ms))
    return min(frontiers.values()) < allowed - behind


class OperatorStage(StageShell[BatchCommit, Output]):
    """The operator's agent over the timeline, its table and checkpoints: a declaration on
    the stage shell (stage.py). Clock probes are not applied; the log-append times go with
    the records (a marker ahead of them is refused); a stored state the operator cannot
    decode is a refusal (CorruptStateError)."""

    checkpoint_metric = "checkpoints"
    refusals = (RefusedError, StateFormatError)

    def __init__(self, worker: Worker, operator: Operator,
                 crash_point: Callable[[str], None] | None) -> None:
        s = worker.settings
        self._operator = operator
        self._crash_point = crash_point
        #: Timeline partition -> the tick its markers seal through, as applied here (what
        #: `backup_due` watches); emptied when the partitions change hands.
        self.frontiers: dict[int, int] = {}
        super().__init__(worker, topic=worker.timeline_name, table=STATE_TABLE,
                         changelog=changelog_topic(s),
                         prefixes=(COUNTER_PREFIX, PARTITION_PREFIX),
                         agent=f"{s.app_id}-operator", timer=f"{s.app_id}-checkpoint")

    def make_commit(self, stores: WorkerStores) -> BatchCommit:
        w = self.worker
        return BatchCommit(self._operator, stores,
                           KafkaSink(w.producer, w.settings, w.metrics.add,
                                     (("releases", "releases_sent"),
                                      ("ledger", "ledger_entries_sent"))),
                           crash_point=self._crash_point, fence=w.fence.check, offload=True,
                           vet=self.vet)

    async def apply(self, msg: Message, gap: Sequence[kafka_io.KafkaRecord],
                    records: list[tuple[int, bytes]]) -> Output | None:
        # Log-append times: a marker ahead of them is refused (Operator.apply).
        stamps = {r.offset: r.timestamp_ms for r in gap}
        stamps[msg.offset] = round(msg.timestamp * 1000)
        # A clock probe changes nothing: not applying it keeps the batches those of the
        # records that carry something.
        records = [r for r in records if r[1] != PROBE_RECORD]
        if not records:
            return None
        return await self.commit.apply(msg.partition, records, stamps)

    async def vet(self, out: Output) -> None:
        """Before a batch that creates counters is published (BatchCommit.vet, under the
        lock): read the ledger on, and refuse (AnnouncedCounterError, raised before
        anything of the batch is sent) a creation the ledger announced under another.
        What the start and the assignments read may be behind: another process's
        creation can land after them (docs/state.md, "A creation is published at most
        once"). A read that fails fails the batch (the worker stops, exit 1; its restart
        reads the whole ledger before it publishes anything)."""
        created = [e for e in out.ledger if e.entry == "created"]
        if not created:
            return
        got = await asyncio.get_running_loop().run_in_executor(
            None, self.worker.ledger_tail.read)
        self.worker.metrics.add("ledger_rereads")
        self._operator.learn_announced(got)
        self._operator.check_ledger(created)

    async def learn_announced(self, announced: Mapping[str, frozenset[str]]) -> None:
        """Give the operator what the ledger announced since its last read, under the
        lock (the agent's applies change the same map)."""
        async with self.lock:
            self._operator.learn_announced(announced)

    async def refuse(self, exc: Exception) -> NoReturn:
        if isinstance(exc, StateFormatError):
            self.worker.refused(CorruptStateError(exc, self.worker.settings))
        self.worker.refused(exc)

    def fold(self, partition: int, out: Output, elapsed_s: float) -> None:
        self.worker.metrics.add_all(out.metrics, prefix="operator_")
        if out.sealed_through is not None:
            self.frontiers[partition] = max(
                out.sealed_through, self.frontiers.get(partition, out.sealed_through))
        if out.metrics["markers_refused"]:
            log.error("ALARM: refused %d marker(s) on timeline partition %d that seal ticks "
                      "the brokers' clock had not reached (written by a worker with a clock "
                      "far ahead, or by someone else with write access to the timeline; "
                      "docs/time.md)", out.metrics["markers_refused"], partition)
        self.worker.surface.batch_committed(partition, out.sealed_through, out.metrics,
                                            elapsed_s)

    async def write(self, full: bool) -> None:
        """Not `full` (the periodic checkpoints): counters advanced by ⊥ ticks only may stay
        behind in the store (docs/state.md)."""
        try:
            check_free_space(self.worker.settings)
            await self.commit.checkpoint(full=full)
        except DeliveryError as exc:
            self.worker.surface.producer_error("operator", exc)
            raise

    def assigned(self, partitions: set[int]) -> None:
        self.worker.surface.assigned(partitions)

    def forgotten(self) -> None:
        self.frontiers.clear()


class WorkerApp(faust.App):
    """faust.App with one hook, `before_stop`, awaited when the app stops, before Faust
    stops its consumer and closes the tables: the worker's last checkpoint; and the
    aiokafka transport of transport.py."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.app")

    before_stop: Callable[[], Awaitable[None]] | None = None
    #: Told of each changelog record the recovery took (BatchedRecovery._take): copy
    #: "restore" or "standby", and how many.
    changelog_taken: Callable[[str, int], None] | None = None
    #: The Kafka settings of the standby copies' reader (standby.py); None: Faust reads
    #: standby copies itself.
    standby_conf: Mapping[str, str] | None = None

    def _new_transport(self) -> TransportT:
        # The worker's consumer polls idle partitions briefly (transport.py): a joining
        # worker's recovery look-ups do not each wait out a 1.5 s fetch.
        return QuickPollTransport(self.conf.broker_consumer, self)

    async def on_stop(self) -> None:
        if self.before_stop is not None:
            await self.before_stop()
        await super().on_stop()


def worker_app(settings: Settings, replication: int = 1) -> WorkerApp:
    """The Faust app of a worker of `settings` (`replication`: its topics' replication
    factor)."""
    return WorkerApp(
        settings.app_id,
        broker=transport.broker_urls(settings),
        broker_credentials=transport.faust_credentials(settings),
        # Faust's default is "faust-<version>" for every worker of every app.
        broker_client_id=kafka_io.client_id(settings),
        store="rocksdb://",  # faust-streaming's RocksDB store, on rocksdict
        # One directory per app id: two apps never share RocksDB files.
        datadir=str(Path(settings.state_dir).resolve() / settings.app_id),
        topic_partitions=settings.partitions,
        processing_guarantee="at_least_once",  # exactly-once is avoided on purpose
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        # Standby copies of each state partition on other workers (when there are any),
        # so a failed worker's counters move with little changelog to replay.
        table_standby_replicas=settings.standby_replicas,
        topic_replication_factor=replication,
        broker_session_timeout=kafka_io.SESSION_TIMEOUT_S,
        broker_heartbeat_interval=1.0,
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        producer_linger=0.005,
        # Records are acknowledged at checkpoints (commit.py), not when the agent is
        # done with them; the revocation handler checkpoints and acknowledges.
        stream_wait_empty=False,
        # Restore and standby copies read the changelog in batches (recovery.py).
        TableManager=BatchedTableManager,
        # Every worker its share of the partitions, standby replicas on (assignor.py).
        PartitionAssignor=BalancedPartitionAssignor,
    )


class Worker:
    """The Faust app of one worker process and what runs in it (see the module doc).

    Built from Settings; `run()` runs it until SIGTERM/SIGINT. `faults` are the test
    hooks (faults.py: the crash points of the kill -9 tests, a shifted wall clock), none
    by default; `clock` the clocks the marker timer and ingest read (default: the
    system's, shifted as `faults` says).
    """

    def __init__(self, settings: Settings, key: NoiseKey, *, replication: int = 1,
                 faults: FaultPlan = NO_FAULTS,
                 announced: Mapping[str, frozenset[str]] | None = None,
                 ledger_read: Mapping[int, int] | None = None,
                 clock: ClockGuard | None = None,
                 unit_claim: UnitClaim | None = None,
                 app: WorkerApp | None = None) -> None:
        self.settings = settings
        # One hook for every stage: its call counts span the process.
        crash_point = self._crash_point = faults.crash_point()
        self.metrics = WorkerMetrics()
        self.partitions = settings.partitions
        #: Why the worker stopped itself (an error type name), None while healthy.
        self.failure: str | None = None
        # `app`: the one the start prepared the state directory with (run_worker).
        self.app = app if app is not None else worker_app(settings, replication)
        self.timeline_name = topic_name(settings, "timeline")
        self.fence = SuspensionFence(SUSPENSION_LIMIT_S, self.fenced)
        self.producer = AsyncProducer(kafka_io.base_config(settings),
                                      on_delivered=self._delivered)
        # The operator's stage (OperatorStage): its agent over the timeline, its table and
        # checkpoints. `announced` (the ledger read at start): the operator refuses to
        # re-create a counter the ledger announced under another creation.
        self.operator = OperatorStage(self, Operator(settings, key, announced=announced,
                                                     unit_claim=unit_claim), crash_point)
        # The ledger read on from where the start's read ended (`ledger_read`: partition
        # -> next offset; None: from the first record), at each assignment: the operator
        # then refuses other workers' creations as a restart would (ledger_tail.py).
        self.ledger_tail = LedgerTail({**kafka_io.base_config(settings), "log_level": "0"},
                                      topic_name(settings, "ledger"), ledger_read or {},
                                      BROKER_WAIT_S)
        # One guard for the marker timer and ingest: both learn the brokers' time from
        # the timeline records they write, and both decide by it (clock.py).
        self.clock = clock if clock is not None else ClockGuard(faults.clock())
        self.ingest = Ingest(settings, on_failure=self._ingest_failed, crash_point=crash_point,
                             on_batch=lambda n: self.surface.ingest_batch(n),
                             clock=self.clock,
                             unit_key=(unit_key(key) if settings.privacy_unit == "user"
                                       else None))
        # The operator surface (metrics, /healthz, /readyz; processor/stream/worker/metrics.py).
        # Marker age by the later clock: a seal held back by a local clock that runs
        # behind shows as stale (and not ready), as it is in the brokers' time.
        self.surface = Surface(settings, lambda: {**self.metrics.counts,
                                                  **self.ingest.metrics(),
                                                  **self.clock.counts()},
                               ingest=self.ingest,
                               clock=lambda: self.clock.read().future_ms / 1000.0)
        # The last tick this process appended a marker through; None until the first
        # append, which first reads the timeline's last marker (`last_marker`).
        self._last_marker: int | None = None
        # Whether this process probed the brokers' time / warned about create times.
        self._probed = False
        self._warned_create_time = False

        #: Every stage, in the order they checkpoint, revoke and are assigned: the
        #: operator's, then (privacy_unit = "user") the bounding stage (unit_stage.py):
        #: one per table of `state_tables`, which the start loaded before they existed.
        self.stages: list[StageShell[Any, Any]] = [self.operator]
        if UNITS_TABLE in state_tables(settings):
            self.stages.append(UnitStage(self, crash_point))
        self.app.before_stop = self.close_stages
        self.app.changelog_taken = self._changelog_taken
        # Standby copies read in a thread of their own, not on the event loop (standby.py).
        self.app.standby_conf = {**kafka_io.base_config(settings), "log_level": "0"}
        self.app.on_partitions_assigned.connect(self.on_assigned)
        self.app.on_partitions_revoked.connect(self.on_revoked)
        self.app.on_partitions_revoked.connect(self.surface.on_revoked)
        # The worker's timers (timers.py: a plain sleep between rounds, not Faust's).
        periodic(self.app, marker_interval_s(settings), self.append_markers,
                 f"{settings.app_id}-markers")
        periodic(self.app, METRICS_LOG_S, self.log_metrics, f"{settings.app_id}-metrics")
        self._announced_ready = False
        periodic(self.app, READY_CHECK_S, self.announce_ready, f"{settings.app_id}-ready")
        # The oldest generation of the garbage collector on a timer (heap.OldGeneration).
        self.old_generation = OldGeneration()
        periodic(self.app, FULL_COLLECTION_S, self.collect_old, f"{settings.app_id}-collect")
        self.app.task(self.start_ingest)

    async def collect_old(self) -> None:
        """The garbage collector's full collection, every FULL_COLLECTION_S (heap.py)."""
        self.old_generation.collect()

    # -- the stages

    async def close_stages(self) -> None:
        """At a clean stop, before Faust stops anything: each stage's last checkpoint (a
        restart then finds every counter's state, under whatever configuration it is
        started with), after which it applies nothing more (`StageShell.close`)."""
        for stage in self.stages:
            await stage.close()

    async def on_revoked(self, sender: Any, /, *args: Any, signal: Any,
                         **kwargs: Any) -> None:
        """Faust's on_partitions_revoked: each stage makes what it applied durable and
        acknowledged, then drops every decoded state (StageShell.on_revoked)."""
        for stage in self.stages:
            await stage.on_revoked()

    def _delivered(self, topic: str, partition: int, offset: int) -> None:
        # In the producer's thread: where this worker's changelog writes landed.
        for stage in self.stages:
            stage.delivered(topic, partition, offset)

    def operator_failed(self, exc: BaseException) -> NoReturn:
        """Exit at once after a failure of a stage's apply or checkpoint (the operator's
        agent and the bounding stage call it)."""
        # The operator never raises on a well-formed record, so this is the local disk,
        # corrupt state or a bug. Skipping the record would fork the published stream from
        # the log, so the process exits at once, like a crash: the record is retried at
        # the next start, which rebuilds the local state from the changelog (the running
        # flag stays). Only the error type (with RocksDB's kind: `failure_name`) or a
        # storage_failure line is logged: a message might name a counter.
        storage = storage_failure(exc, self.settings)
        if storage is not None:
            log.critical("stopping the worker: %s", storage)
            print_error(storage, flush=True)
        else:
            log.critical("operator failed (%s); stopping the worker", failure_name(exc))
        logging.shutdown()
        os._exit(1)

    def _changelog_taken(self, copy: str, records: int) -> None:
        """The recovery took `records` changelog records into a restore or standby copy."""
        self.metrics.add(f"changelog_{copy}_records", records)

    def fenced(self, gap_s: float) -> NoReturn:
        # Called in the commit, in the fence's thread or at SIGCONT. Exiting at once,
        # unflushed, is the point: nothing more of this process may reach the changelog or
        # the public topics, and the restart rebuilds the state from the changelog
        # (RUNNING_FLAG).
        log.critical("the process was suspended for %.1f s, long enough to lose its "
                     "partitions; exiting before it writes anything (a restart is safe)",
                     gap_s)
        logging.shutdown()
        os._exit(FENCED_EXIT)

    def refused(self, exc: Exception) -> NoReturn:
        """Exit (code 2) on a stage's refusal of its stored state (RefusedError)."""
        # Nothing of the record was published; exiting at once (code 2, like a start
        # error) keeps Faust from committing past it. The messages name only public
        # things (declared or announced counters, parameters, store keys), with the remedy.
        log.critical("refused: %s", exc)
        print_error(str(exc), flush=True)
        logging.shutdown()
        os._exit(2)

    async def on_assigned(self, sender: Any, /, *args: Any, signal: Any,
                          **kwargs: Any) -> None:
        assigned = args[0]  # the set of TPs assigned to this worker
        # First, before any await (Faust's recovery may resume the partitions, and the
        # agents apply their records, as soon as this handler yields): what each stage
        # expects of the assignment, so that each partition's first change is
        # checkpointed at once (acks.PendingAcks).
        mine = [stage.expect(assigned) for stage in self.stages]
        # Early knowledge of what other workers created: a taken-over partition may create
        # only what the ledger does not announce under another creation. Not ordered
        # before the assignment's first records (see above): the rule rests on the read
        # before a creation is published (OperatorStage.vet).
        await self._learn_ledger()
        for stage, partitions in zip(self.stages, mine, strict=True):
            await stage.on_assigned(partitions)

    async def _learn_ledger(self) -> None:
        """Read the ledger on (LedgerTail) and give the operator what it announced. A
        read that fails leaves the operator with what it knew (the start's read and what
        it read since, which its refusals keep relying on) and is retried at the next
        assignment from the same position."""
        try:
            got = await asyncio.get_running_loop().run_in_executor(None, self.ledger_tail.read)
        except (KafkaException, RuntimeError, TimeoutError) as exc:
            log.warning("the ledger topic could not be read at the assignment (%s): the "
                        "operator refuses re-creations by the ledger it read before",
                        type(exc).__name__)
            return
        await self.operator.learn_announced(got)

    # -- timers

    async def append_markers(self) -> None:
        """'Sealed through n' on every timeline partition (idempotent), n by the earlier of
        the local and the brokers' clocks (`clock.next_marker`): a clock that runs ahead
        seals nothing of the future, one that runs behind raises the clock alarm and
        delays the seal (docs/time.md). The group's leader appends them; any other worker
        appends them too once the partitions it holds are sealed BACKUP_SEAL_S behind what
        the clocks allow (`backup_due`): a leader cut off from the brokers (its session
        not yet expired, so no other leader) does not stop the sealing."""
        try:
            leader = self.app.is_leader()
        except ConsumerNotStarted:
            return  # the timer fired before the group was joined: the next round decides
        if not leader:
            allowed = sealed_through(self.clock.read().seal_ms, self.settings)
            if not backup_due(self.operator.frontiers, allowed, self.settings):
                return
            # A stalled leader: start from the timeline's last marker, whoever wrote it.
            self._last_marker = None
            self.metrics.add("backup_marker_rounds")
        if self._last_marker is None:
            # Never a second marker through a tick the timeline already has one for (say
            # after a restart within one tick): a counter's creation is identified by its
            # marker (identity.creation_tag), and a restart after a loss of state must
            # not meet the marker that created its counters again.
            self._last_marker = await asyncio.get_running_loop().run_in_executor(
                None, last_marker, kafka_io.base_config(self.settings), self.timeline_name)
        producer = self.app.producer
        try:
            if not self.clock.has_reference and not self._probed:
                # The brokers' time before this leader's first marker: an empty event batch
                # (a no-op for the operator and for replay) whose acknowledgement carries
                # its log-append time.
                sent = self.clock.mono_ms()
                ack = await producer.send(self.timeline_name, None, PROBE_RECORD, 0, None,
                                          None)
                self._probed = True
                self._observe([await ack], sent)
            n = next_marker(self.clock.read(), self._last_marker, self.settings)
            if n is None:
                return
            record = encode_marker(n)
            sent = self.clock.mono_ms()
            acks = [await producer.send(self.timeline_name, None, record, p, None, None)
                    for p in range(self.partitions)]
        except NotReady:
            # The timer can fire while Faust still starts its producer (a start that
            # rebuilds the table from the changelog takes seconds): nothing was sent, and
            # the next round appends the marker (markers are idempotent).
            return
        self._observe(await asyncio.gather(*acks), sent)
        self._last_marker = n
        self.metrics.add("markers_appended", self.partitions)

    def _observe(self, metadata: Sequence[Any], sent_mono_ms: int) -> None:
        """The brokers' log-append times of timeline records this leader appended (aiokafka
        RecordMetadata: timestamp_type 1) become the clock reference."""
        acked = self.clock.mono_ms()
        stamps = [int(m.timestamp) for m in metadata
                  if m is not None and m.timestamp_type == 1]
        if stamps:
            self.clock.observe(Stamp(max(stamps), sent_mono_ms, acked))
        elif not self._warned_create_time:
            self._warned_create_time = True
            log.warning("the timeline topic %r stamps records with their create time: the "
                        "wall clock is not cross-checked against the brokers' (set "
                        "message.timestamp.type=LogAppendTime on it; docs/time.md)",
                        self.timeline_name)

    async def announce_ready(self) -> bool:
        """The ready line, once: when /readyz first passes (partitions assigned, a recent
        marker applied on each). True once written: its timer stops."""
        if self._announced_ready:
            return True
        ok, why = self.surface.readiness()
        if ok:
            self._announced_ready = True
            lifecycle.info("worker ready: %s; publishing to %r and %r", why,
                           self.settings.topics.counts, self.settings.topics.ledger)
        return self._announced_ready

    async def log_metrics(self) -> None:
        log.info("metrics %s", self.metrics.summary(self.ingest.metrics()))

    # -- the ingest thread

    async def start_ingest(self) -> None:
        self.ingest.start()

    def _ingest_failed(self, exc: BaseException) -> None:
        """Called in the ingest thread when it stopped on an error: stop the whole worker
        the way SIGTERM does (a clean Faust stop; the ingest batch in hand was not
        committed, so it is re-read at the next start)."""
        self.failure = f"ingest: {type(exc).__name__}"
        os.kill(os.getpid(), signal.SIGTERM)

    def stop_ingest(self) -> None:
        self.ingest.stop()

    # -- running

    def take_loaded(self, loaded: LoadResult) -> None:
        """What the start's bulk load applied (`load_local_state`): the keys it found
        stale go to their tables (the owner writes them again), its records to the
        metrics, and its line to the lifecycle log."""
        for stage in self.stages:
            for partition, keys in loaded.stale.get(stage.table.name, {}).items():
                stage.table.stale[partition].update(keys)
        self.metrics.add("changelog_bulk_records", loaded.records)
        lifecycle.info("bulk load: %d changelog record(s) of %d partition(s) in %.1f s "
                       "(%.0f records/s)%s", loaded.records, loaded.partitions,
                       loaded.seconds, loaded.records / max(loaded.seconds, 1e-3),
                       "" if loaded.complete else "; stopped early, the recovery reads the rest")

    def run(self, local: LocalState, loglevel: str = "warning",
            start_steps: Sequence[tuple[str, float]] = ()) -> int:
        """Run until SIGTERM/SIGINT (or a failure); returns the exit code. `local`: the
        state directory as the start prepared and loaded it (`load_local_state`);
        `start_steps`: the start's steps before this call and their seconds, logged with
        the state directory's (the `start checks` line)."""
        flag = local.flag
        try:
            # From here on Faust may write the local databases: an unclean stop's files
            # are discarded by the next start.
            flag.write_text(str(os.getpid()))
        except OSError as exc:
            print_error(storage_failure(exc, self.settings) or (
                f"the running flag {str(flag)!r} cannot be written ({type(exc).__name__}): "
                "check the state directory and its permissions"), flush=True)
            return 2
        # Only now: a start refused by any check (the state directory's included)
        # prints its one error line and nothing else.
        lifecycle.info("start checks: %s", ", ".join(
            f"{name} {s:.2f} s"
            for name, s in [*start_steps, ("state directory", local.prepared_s)]))
        self.take_loaded(local.loaded)
        # After every start check (brokers, topics, ledger, state directory): a start that
        # is refused prints its one error line and nothing else.
        s = self.settings
        lifecycle.info("worker starting: app %r, brokers %s, %d counter(s), %s (%s "
                       "calibration), epsilon %g and delta %g per event, privacy unit %s, "
                       "ticks of %d ms; state in %s", s.app_id, s.bootstrap_servers,
                       len(s.counters), s.mechanism, s.calibration, s.epsilon, s.delta,
                       s.privacy_unit, s.tick_ms, s.state_dir)
        worker = faust.Worker(self.app, loglevel=loglevel, quiet=True,
                              override_logging=False, redirect_stdouts=False)
        # No progress spinner: it writes terminal escape codes ("\x1b[?25h") into whatever
        # stdout is, a log file or a log shipper's pipe included.
        worker.spinner = None
        self.surface.start(worker.loop)
        self.fence.install_sigcont()
        self.fence.start()
        code = 1
        # What exists now (modules, classes, the app) lives as long as the process: out of
        # the collector's reach, a full collection walks only what the run allocates
        # (about 86,000 objects fewer, some 50 ms of CPU per full collection). Collected
        # first, so no garbage of the start is kept for good.
        gc.collect()
        gc.freeze()
        # Full collections on a timer only (`collect_old`), not each time the releases of
        # a few markers were promoted (heap.OldGeneration).
        self.old_generation.install()
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
        finally:
            crash = self.app.crash_reason
            storage = None if crash is None else storage_failure(crash, self.settings)
            if storage is not None:  # Faust crashed on it (opening a partition's database)
                log.critical("the worker stopped: %s", storage)
                print_error(storage, flush=True)
                code = code or 1
            self.fence.stop()
            self.stop_ingest()
            self.surface.close()
            if self.failure is not None:
                log.error("worker stopped after a failure (%s)", self.failure)
                code = code or 1
            log.info("worker stopped: metrics %s", self.metrics.summary(self.ingest.metrics()))
            if code == 0:
                with contextlib.suppress(OSError):
                    flag.unlink()
        return code


def last_marker(conf: Mapping[str, str], topic: str) -> int:
    """The tick the last marker of the timeline `topic` seals through (the highest over its
    partitions; -(1 << 62) if there is none). Each partition is read backwards from its
    end, MARKER_LOOKBACK records at a time, down to its last marker: at most one tick's
    worth of event batches."""
    best = -(1 << 62)
    for p, (lo, hi) in kafka_io.end_offsets(conf, topic).items():
        end = hi
        while end > lo:
            begin = max(lo, end - MARKER_LOOKBACK)
            found = [n for r in kafka_io.read_range(conf, topic, p, begin, end)
                     if (n := marker_tick(r.value)) is not None]
            if found:
                best = max(best, *found)
                break
            end = begin
    return best


def ensure_topics(settings: Settings, replication: int | None = None) -> int:
    """Create the five topics and the state changelog (P partitions each; the input keeps
    its own count if it exists) and wait until every partition of the timeline and the
    changelog has a leader.

    The changelog is created here, compacted, as Faust would: two workers starting at once
    otherwise race to create it and one may see it before every partition is listed, which
    Faust reports as a partition-count mismatch at the first state write. Returns the
    replication factor used (default: min(3, live brokers)). StartError when the brokers do
    not answer, or the timeline or changelog topic has another number of partitions.
    """
    # librdkafka's own log lines (one per failed connection attempt) stay off stderr: a
    # broker that does not answer is reported once, below.
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    partitions = settings.partitions
    keyed = [topic_name(settings, "timeline"), changelog_topic(settings)]
    if settings.privacy_unit == "user":
        # The units topic (log-append time, the timeline's retention: replay recomputes
        # the kept set from it) and the bounding stage's changelog.
        keyed += [units_topic(settings), units_changelog_topic(settings)]
    try:
        kafka_io.require_brokers(conf, BROKER_PROBE_S)
    except kafka_io.BrokerUnavailable as exc:
        raise StartError(str(exc)) from None
    try:
        if replication is None:
            replication = kafka_io.replication_for(conf, timeout_s=BROKER_WAIT_S)
        # The input belongs to its producers: created (if missing) with the broker's
        # defaults. The others get their retention here, the one place (docs/downstream.md).
        kafka_io.create_topics(conf, [topic_name(settings, "input")], partitions,
                               replication=replication, timeout_s=BROKER_WAIT_S)
        # Timeline records carry the brokers' log-append time: the clock cross-check of
        # the leader and of ingest reads it off their acknowledgements (clock.py).
        extra = {t: {"message.timestamp.type": "LogAppendTime"}
                 for t in (keyed[0], units_topic(settings))}
        for topic, retention_ms in retention_required(settings).items():
            kafka_io.create_topics(conf, [topic], partitions, replication=replication,
                                   config={**extra.get(topic, {}), "cleanup.policy": "delete",
                                           "retention.ms": str(retention_ms),
                                           "retention.bytes": "-1"},
                                   timeout_s=BROKER_WAIT_S)
        kafka_io.create_topics(conf, [t for t in keyed[1:] if t != units_topic(settings)],
                               partitions, replication=replication,
                               config={"cleanup.policy": "compact"}, timeout_s=BROKER_WAIT_S)
        have = {t: kafka_io.partitions_with_leaders(conf, t, partitions, BROKER_WAIT_S)
                for t in keyed}
    except (kafka_io.AccessRefused, KafkaException) as exc:
        raise StartError(kafka_io.broker_failure(conf, exc)) from None
    except RuntimeError as exc:  # a topic that cannot be created (message names it)
        raise StartError(str(exc)) from None
    for topic, n in have.items():
        if n != partitions:
            raise StartError(f"the topic {topic!r} has {n} partitions, the configuration says "
                             f"{partitions}: counters would land in the wrong partitions (fix "
                             "`partitions` or use new timeline and changelog topics)")
    # After the partition counts: a start that is refused anyway says only why.
    check_retention(settings, conf)
    return replication


def check_retention(settings: Settings, conf: Mapping[str, str]) -> None:
    """Topics that existed before keep their own settings. A ledger that does not keep
    every entry is refused (StartError); any other topic that keeps records for less
    than required gets a warning (the operator may mean it: say, a shorter audit window
    agreed elsewhere). Topics that cannot be described get a warning too."""
    required = retention_required(settings)
    ledger = topic_name(settings, "ledger")
    try:
        have = kafka_io.topic_configs(conf, required, BROKER_WAIT_S)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        what = err.name() if isinstance(err, KafkaError) else type(exc).__name__
        log.warning("cannot check the retention of the topics (%s): make sure the ledger "
                    "topic %r keeps every entry (retention.ms=-1, cleanup.policy=delete)",
                    what, ledger)
        return
    cfg = have.get(ledger, {})
    kept = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    wrong = {k: cfg.get(k) for k, v in kept.items() if cfg.get(k) != v}
    if wrong:
        found = ", ".join(f"{k}={v}" for k, v in wrong.items())
        raise StartError(
            f"the ledger topic {ledger!r} would not keep every entry ({found}); it must "
            "have cleanup.policy=delete, retention.ms=-1 and retention.bytes=-1 (set them "
            f"with kafka-configs --bootstrap-server {settings.bootstrap_servers} --alter "
            f"--entity-type topics --entity-name {ledger} "
            "--add-config retention.ms=-1,retention.bytes=-1,cleanup.policy=delete)")

    def forever(ms: int) -> float:
        return float("inf") if ms < 0 else float(ms)

    for topic, want in required.items():
        ms = int(have.get(topic, {}).get("retention.ms", "-1"))
        if forever(ms) < forever(want):
            log.warning("topic %r keeps records for retention.ms=%d, less than the %s "
                        "required (docs/downstream.md): it existed before and keeps its "
                        "own setting", topic, ms, "forever (-1)" if want < 0 else want)


def _tabledir(settings: Settings, app: faust.App) -> Path:
    """Where Faust keeps `app`'s partition databases (its tabledir, under the state
    directory when relative)."""
    tabledir = Path(app.conf.tabledir)
    return tabledir if tabledir.is_absolute() else Path(settings.state_dir) / tabledir


def _prepare_state_dir(settings: Settings, tabledir: Path) -> Path:
    """Discard the local table files under `tabledir` after an unclean stop; mark this run
    as running. StartError (one line: cause, path, remedy) when the directory cannot be
    written or its disk is full."""
    state_dir = Path(settings.state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        check_free_space(settings)
        flag = state_dir / f"{settings.app_id}.{RUNNING_FLAG}"
        # Before an unclean stop's files are discarded: those of other topics are not.
        _check_not_stale(tabledir, settings)
        if flag.exists():
            log.warning("previous worker did not stop cleanly: rebuilding table state from "
                        "the changelog")
            shutil.rmtree(tabledir, ignore_errors=True)
        flag.write_text(str(os.getpid()))
        # The flag stays if this fails: the next start discards the local files.
        _check_databases(tabledir, settings)
    except OSError as exc:
        raise StartError(storage_failure(exc, settings) or (
            f"the state directory {str(state_dir)!r} cannot be prepared "
            f"({type(exc).__name__}): check the path and its permissions")) from None
    return flag


def _check_not_stale(tabledir: Path, settings: Settings) -> None:
    """StartError (one line: the directory, the remedy) when a local partition database
    has applied changelog records its changelog topic on the brokers does not have (the
    brokers were recreated: processor/stream/worker/stale.py)."""
    conf = {**kafka_io.base_config(settings), "log_level": "0"}

    def ends(topic: str) -> Mapping[int, tuple[int, int]]:
        try:
            return kafka_io.end_offsets(conf, topic, timeout_s=BROKER_WAIT_S)
        except RuntimeError:  # the topic is not there: it ends at 0
            return {}
        except KafkaException as exc:
            raise StartError(kafka_io.broker_failure(conf, exc)) from None

    stale = stale_databases(tabledir, lambda table: table_changelog(settings, table), ends)
    if stale:
        first = stale[0]
        where = Path(settings.state_dir)
        raise StartError(
            f"the local state directory {str(where)!r} belongs to other topics: "
            f"{first.path.name} has applied {first.topic!r} partition {first.partition} "
            f"through offset {first.persisted}, the brokers' topic ends at {first.end} "
            f"({len(stale)} database(s) so; the brokers were recreated or the topic "
            f"deleted). Remedy: remove it (rm -rf {where}) and start with a new noise key "
            "(python -m processor keygen) or new counter starts: the old topics' releases "
            "carry this configuration's noise (docs/state.md)")


def _check_databases(tabledir: Path, settings: Settings) -> None:
    """Open each local partition database once before Faust does: a corrupt one is one
    StorageError line here, not a crash inside Faust's rebalance."""
    if not tabledir.is_dir():
        return
    for path in sorted(tabledir.glob("*.db")):
        try:
            db = Rdict(str(path), options=RdictOptions(raw_mode=True))
            db.close()
        except Exception as exc:  # rocksdict raises plain Exception("Corruption: ...")
            raise StorageError(storage_failure(exc, settings) or (
                f"the local state database {str(path)!r} cannot be opened "
                f"({type(exc).__name__}). Remedy: restart: the restart rebuilds the local "
                "state from the changelog and loses nothing")) from None


#: A counter declared this long before the worker starts gets a warning with its error
#: bound (`far_starts`): its count carries the error of every tick since its start.
FAR_START_S: Final = 86_400


def far_starts(settings: Settings, now_ms: int) -> list[str]:
    """One line per start older than FAR_START_S: how many ticks back, and the error
    bound (beta of the settings, the planner's per-tick bound, core.bounds) at the present
    tick against a counter one day old. Only public quantities."""
    from processor.core.bounds import ecc_bound, simecc_bound
    from processor.core.cc import DEFAULT_BASE

    bound = simecc_bound if settings.mechanism == "simecc" else ecc_bound
    if settings.mechanism not in ("ecc", "simecc"):
        return []
    day = max(1, FAR_START_S * 1000 // settings.tick_ms)
    by_start: dict[int, list[str]] = {}
    for name, start in settings.counters.items():
        by_start.setdefault(start, []).append(name)
    lines = []
    for start, names in sorted(by_start.items()):
        ticks = (now_ms - start) // settings.tick_ms
        if ticks * settings.tick_ms < FAR_START_S * 1000:
            continue
        args = (settings.epsilon, settings.delta, settings.beta)
        now_b = bound(*args, ticks, DEFAULT_BASE, settings.calibration)
        day_b = bound(*args, day, DEFAULT_BASE, settings.calibration)
        shown = ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more"
                                                if len(names) > 3 else "")
        days = ticks * settings.tick_ms / 86_400_000
        lines.append(f"counter(s) {shown} start {ticks:,} ticks ({days:.1f} days) before "
                     "now: at the present tick the error "
                     f"bound (probability {1 - settings.beta:g}) is +/-{now_b:,.1f} events, "
                     f"against +/-{day_b:,.1f} for a counter started a day ago; the first "
                     "marker publishes the catch-up (docs/downstream.md), and `python -m "
                     "processor plan` shows the error by horizon")
    return lines


def since_process_start() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(stat[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError):
        return None


def run_worker(settings: Settings, key: NoiseKey, *, loglevel: str = "warning",
               phases: Sequence[tuple[str, float]] = ()) -> int:
    """Create the topics, then run one worker until SIGTERM/SIGINT; returns the exit code.
    `phases`: the start's steps before this call and their seconds (the `start checks`
    line)."""
    steps = list(phases)
    began = time.monotonic()
    faults = FaultPlan.from_env()
    replication = ensure_topics(settings)
    # After the brokers answered: a start that fails says only why (one line).
    for line in far_starts(settings, int(time.time() * 1000)):
        log.warning("%s", line)
    steps.append(("topics", time.monotonic() - began))
    app = worker_app(settings, replication)
    # The ledger is read in a thread of its own while this one prepares and loads the
    # local state: each spends much of its time waiting on the brokers, and neither needs
    # the other. The load publishes nothing and writes only what the changelog holds, so
    # a start the ledger refuses loses nothing by it (docs/state.md, "Restore").
    ledger = LedgerRead(settings, key)
    local: LocalState | StreamError
    try:
        local = load_local_state(settings, app, faults.crash_point())
    except (StartError, StorageError) as exc:
        local = exc
    # The ledger's verdict first, as when the two ran one after the other.
    announced, claim, families, ends = ledger.result()
    steps.append(("ledger", ledger.seconds))
    if isinstance(local, StorageError):
        log.critical("the worker stopped: %s", local)
        print_error(str(local), flush=True)
        return 1
    if isinstance(local, StreamError):
        raise local
    if families:
        record_families(settings, families)
    return Worker(settings, key, replication=replication, faults=faults,
                  announced=announced, ledger_read=ends, unit_claim=claim,
                  app=app).run(local, loglevel, steps)


@dataclass(frozen=True)
class LocalState:
    """The state directory as the start left it (`load_local_state`): the running flag's
    path (absent until `Worker.run` writes it), what the bulk load applied, and the
    seconds the state directory's checks took (the `start checks` line)."""

    flag: Path
    loaded: LoadResult
    prepared_s: float


def load_local_state(settings: Settings, app: faust.App,
                     crash_point: Callable[[str], None] | None) -> LocalState:
    """Prepare the state directory (`_prepare_state_dir`) and fill its databases from the
    changelogs of `state_tables` (bulkload.py), before the worker joins its group.
    Returns with the running flag absent: the load writes nothing the changelog lacks (each
    chunk's values and persisted offset in one write batch), so a crash during it, a stop
    request that ends it (SIGTERM, Ctrl-C), or a start refused after it, leaves databases
    the next start keeps and continues. Any other error ending the load writes the flag,
    so the next start discards the local files (a database that failed in a way nobody
    foresaw is not read again); StorageError when a database cannot be opened or written.
    StartError or StorageError as `_prepare_state_dir`. `crash_point`: the kill -9 tests'
    hook (faults.py)."""
    began = time.monotonic()
    tabledir = _tabledir(settings, app)
    flag = _prepare_state_dir(settings, tabledir)
    prepared_s = time.monotonic() - began
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    flag.unlink()
    try:
        loaded = bulk_load(conf, tabledir, state_tables(settings), crash_point=crash_point)
    except KeyboardInterrupt:
        raise  # a stop request (main.Terminated at SIGTERM): the databases stay, as at a kill
    except BaseException as exc:
        flag.write_text(str(os.getpid()))
        if not isinstance(exc, LocalDatabaseError):
            raise
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise StorageError(storage_failure(cause, settings) or (
            f"a local state database under {str(tabledir)!r} cannot be loaded "
            f"({type(cause).__name__}). Remedy: restart: the restart rebuilds the local "
            "state from the changelog and loses nothing")) from None
    return LocalState(flag, loaded, prepared_s)


#: What `read_ledger` returns: counter -> announced creation tags, the per-unit claim, the
#: open families' records to write, and where the read ended (partition -> next offset).
LedgerAtStart = tuple[dict[str, frozenset[str]], UnitClaim | None,
                      list[tuple[bytes, bytes]], dict[int, int]]


class LedgerRead:
    """`read_ledger` in a thread of its own, started at once. `result()` waits for it and
    returns what it returned or raises what it raised; `seconds` is how long it took."""

    def __init__(self, settings: Settings, key: NoiseKey) -> None:
        self.seconds = 0.0
        self._got: LedgerAtStart | None = None
        self._failed: BaseException | None = None
        # A daemon: a start that fails in the meantime does not wait for it to exit.
        self._thread = threading.Thread(target=self._read, args=(settings, key),
                                        name="ledger-read", daemon=True)
        self._thread.start()

    def _read(self, settings: Settings, key: NoiseKey) -> None:
        began = time.monotonic()
        try:
            self._got = read_ledger(settings, key)
        except BaseException as exc:  # handed to the start's thread by result()
            self._failed = exc
        finally:
            self.seconds = time.monotonic() - began

    def result(self) -> LedgerAtStart:
        self._thread.join()
        if self._failed is not None:
            raise self._failed
        assert self._got is not None
        return self._got


def record_families(settings: Settings, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Write the families' records (`lifetime.family_entries`) to the ledger and wait for
    their acknowledgement, before the worker makes any key with their gates' delta0: a
    later start then knows the largest delta0 any gate used (docs/open-keys.md)."""
    conf = kafka_io.base_config(settings)
    try:
        kafka_io.produce_all(conf, topic_name(settings, "ledger"), records,
                             timeout_s=BROKER_WAIT_S)
    except (KafkaException, RuntimeError) as exc:
        raise StartError(f"cannot write the open families' records to the ledger topic "
                         f"({type(exc).__name__}): a later start must know their gates' "
                         "delta0 before a key is made") from None


def read_ledger(settings: Settings, key: NoiseKey) -> LedgerAtStart:
    """The ledger topic read at start: `ledger_at_start` of its values, the open
    families' records this start writes before anything else (lifetime.family_entries),
    and where the read ended (partition -> next offset: the worker's LedgerTail reads on
    from there)."""
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    topic = topic_name(settings, "ledger")
    try:
        marks = kafka_io.end_offsets(conf, topic, timeout_s=BROKER_WAIT_S)
        entries = sum(hi - lo for lo, hi in marks.values())
        got = kafka_io.read_values(conf, topic, marks,
                                   timeout_s=BROKER_WAIT_S + entries / LEDGER_READ_RATE)
        ledger = [value for _p, values in sorted(got.items()) for _o, value in values]
    except (KafkaException, RuntimeError, TimeoutError) as exc:
        raise StartError(f"cannot read the ledger topic ({type(exc).__name__}): a worker "
                         "must know what was announced before it publishes") from None
    announced, claim = ledger_at_start(settings, key, ledger)
    recorded = lifetime.recorded_gates(lifetime.family_objects(ledger))
    ends = {p: hi for p, (_lo, hi) in marks.items()}
    return announced, claim, lifetime.family_entries(settings, recorded), ends


def ledger_at_start(settings: Settings, key: NoiseKey, ledger: Sequence[bytes | None]
                    ) -> tuple[dict[str, frozenset[str]], UnitClaim | None]:
    """What the ledger announced so far (counter -> creation tags, for the operator's
    refusal to publish a second value for a published (counter, tick)) and the per-unit
    guarantee this start's entries state (lifetime.unit_claim, with the largest gate
    delta0 the families' records and the configuration name). Refuses, before anything
    is applied or published, a configuration under which an entry would state a guarantee
    that does not hold over the deployment's life (LifetimeError) and, under
    on_parameter_change = "refuse", one that changes an announced counter's parameters
    (ParameterChangeError): the halt's time is the start's, never an event's."""
    # Each entry decoded once, for both reads, and let go: a million decoded entries
    # held at once cost the start seconds and a gigabyte.
    announced = Announced()
    entries = lifetime.entries_of(announced.passing(lifetime.ledger_objects(ledger)))
    statements = list(entries)  # the distinct statements, in the order they first appear
    recorded = lifetime.recorded_gates(lifetime.family_objects(ledger))
    claim = lifetime.unit_claim(settings, statements, recorded)
    provenance = ConfiguredProvenance(settings, key)
    # check_stated's verdict on a set of parameters does not depend on the counter (the
    # name only goes into its error), and a ledger states few sets: when each passes, no
    # counter can be refused; else the check per counter finds and names the first.
    if not all(provenance.passes(st.parameters) for st in statements):
        for name, stated in sorted(lifetime.counter_parameters(entries).items()):
            # The counters this configuration may restore: a counter no longer declared
            # (and no undeclared ones allowed) is never loaded again. An admitted key of
            # a configured open family is announced like a declared counter.
            if (name in settings.counters or settings.allow_undeclared
                    or family_of(name) in settings.families):
                for params in sorted(stated):
                    provenance.check_stated(name, params)
    return announced.tags, claim


def main_worker(argv: Sequence[str] | None = None) -> int:
    """`python -m processor worker --config F [--key-file K] [--loglevel L]`."""
    p = CommandParser(prog="python -m processor worker",
                      description="Run the private-count stream processor.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (overrides noise_key_file)")
    p.add_argument("--key-format", choices=KEY_FORMATS,
                   help="how the key file is read (overrides noise_key_format; default hex)")
    p.add_argument("--loglevel", default="warning",
                   help="debug, info, warning (default) or error")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text (default): one readable line per record; json: one JSON object "
                   "per line (ts, level, logger, msg, exc) for log shippers")
    args = p.parse_args(list(argv) if argv is not None else None)
    # Whatever --loglevel says, the Kafka clients and Faust stay at or above the level
    # where they would log credentials and records (processor/stream/model/logs.py).
    configure_logging(args.loglevel, args.log_format)
    level = logging.getLogger().getEffectiveLevel()
    lifecycle.setLevel(logging.INFO if level <= logging.WARNING else level)
    imports = since_process_start()
    began = time.monotonic()
    try:
        settings = load_settings(args.config)
        key = load_noise_key(settings, args.key_file, args.key_format)
        phases = [] if imports is None else [("process start to main", imports)]
        phases.append(("configuration", time.monotonic() - began))
        return run_worker(settings, key, loglevel=args.loglevel, phases=phases)
    except (ConfigError, NoiseKeyError, StartError, RefusedError) as exc:
        print_error(exc)
    return 2


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    sys.exit(main_worker())
