"""Every private name of faust-streaming and aiokafka the worker uses or relies on, in one
place, with the versions they were checked against (tests/stream/test_upstream.py fails
when an installed version differs or a name changes shape; pyproject.toml pins
faust-streaming to the checked version). Each entry: the name (`module:Class.attr`), the
worker module that uses it, and why.
"""

from __future__ import annotations

from typing import Final

#: The distributions whose private names are listed, and the versions checked.
CHECKED_VERSIONS: Final = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}

#: (name, user, why). An attribute that is not on the class is one its __init__ sets.
PRIVATE_NAMES: Final = (
    ("faust.app.base:App._new_transport", "app.py",
     "overridden: the transport with a short fetch long-poll (transport.py)"),
    ("faust.transport.drivers.aiokafka:Consumer._new_consumer_thread", "transport.py",
     "overridden: the consumer thread that builds the quick-poll consumer"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._create_worker_consumer",
     "transport.py", "overridden: sets the consumer's fetch wait"),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer._fetch_max_wait_ms", "transport.py",
     "set before start: Faust fixes 1.5 s, no setting changes it"),
    ("faust.transport.consumer:Consumer._drain_messages", "transport.py",
     "overridden: Faust's message loop, a callback run without a task unless it waits"),
    ("faust.transport.consumer:Consumer._read_offset", "transport.py",
     "read and set as Faust's message loop and seek do"),
    ("faust.transport.consumer:ThreadDelegateConsumer._thread", "transport.py",
     "the consumer thread, on which a never committed stream partition is sought"),
    ("faust.transport.consumer:Consumer._commit_every", "transport.py",
     "read as Faust's message loop does"),
    ("faust.transport.consumer:Consumer._n_acked", "transport.py",
     "read and reset as Faust's message loop does"),
    ("faust.transport.consumer:Consumer._add_gap", "transport.py",
     "called as Faust's message loop calls it"),
    ("mode.services:Service._stopped", "transport.py",
     "the consumer's and the fetcher's stop, read as Faust's message loop does"),
    ("faust.transport.conductor:Conductor._build_handler", "transport.py",
     "extended: a changelog partition's handler that can hand a record over at once"),
    ("faust.transport.conductor:Conductor._tp_to_callback", "transport.py",
     "read: the handler of a message's partition, as Faust's on_message looks it up"),
    ("faust.transport.conductor:Conductor._tp_to_callback_lock", "transport.py",
     "read: a held or awaited lock leaves the message to Faust's on_message"),
    ("asyncio.locks:Lock._waiters", "transport.py",
     "read: a lock with waiters is taken by them first (Lock.acquire)"),
    ("faust.serializers.registry:Registry._serializer", "transport.py",
     "called: the value codec Faust's decode resolves (raw bytes: no decode)"),
    ("faust.tables.recovery:Recovery._slurp_changelogs", "recovery.py",
     "overridden: the changelog loop that takes records in batches"),
    ("faust.tables.recovery:Recovery._active_events_received_at", "recovery.py",
     "kept as Faust's loop keeps it"),
    ("faust.tables.recovery:Recovery._standby_events_received_at", "recovery.py",
     "kept as Faust's loop keeps it"),
    ("faust.tables.recovery:Recovery._last_flush_at", "recovery.py",
     "kept as Faust's loop keeps it"),
    ("faust.tables.recovery:Recovery._last_active_event_processed_at", "recovery.py",
     "the restore's time estimate, kept as Faust's loop keeps it"),
    ("faust.tables.recovery:Recovery._processing_times", "recovery.py",
     "the restore's time estimate, kept as Faust's loop keeps it"),
    ("faust.tables.recovery:Recovery._set_recovery_ended", "recovery.py",
     "called where Faust's loop ends an active recovery"),
    ("faust.tables.recovery:Recovery._actives_span", "recovery.py",
     "tagged where Faust's loop tags it"),
    ("faust.tables.recovery:Recovery._standbys_span", "recovery.py",
     "finished where Faust's loop finishes it"),
    ("faust.tables.manager:TableManager._recovery", "recovery.py",
     "the recovery service BatchedTableManager builds (BatchedRecovery)"),
    ("faust.stores.rocksdb:Store._db_for_partition", "table.py",
     "the partition's rocksdict database: checkpoints write it in one batch"),
    ("faust.stores.rocksdb:Store._db_for_partition", "recovery.py",
     "a standby partition's database, opened on the event loop for the standby reader"),
    ("faust.tables.manager:TableManager._changelogs", "recovery.py",
     "the table of a standby partition's changelog topic (the standby reader)"),
    ("faust.assignor.partition_assignor:PartitionAssignor._perform_assignment",
     "assignor.py", "run with the balanced copartitioned assignor in its globals"),
    ("faust.transport.consumer:Consumer._new_offset", "acks.py",
     "relied on: commits only up to the run of acked offsets (ack_refetched)"),
)
