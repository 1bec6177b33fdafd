"""Replay, the audit: recompute the private-count and ledger streams from the timeline
topic and compare them, record by record, with what was published.

It runs the very code the worker runs, `commit.BatchCommit`, over the timeline (per
partition, in offset order) on a `DictStore` with a sink that only collects, and compares
each partition with the published records of its counters before the next one. No
Faust import here. docs/replay.md is the auditor's guide; the cut below is its contract.

The cut (what must have been published, on a live system or after any stop)
--------------------------------------------------------------------------
Replay takes three snapshots, in this order: (1) the offsets C_p the worker's consumer
group (the app id) committed on each timeline partition p; (2) the high watermarks of
the private-count and ledger topics (it reads them up to there); (3) the high watermarks
E_p of the timeline (it recomputes every record below them). The order matters: the
worker publishes a batch's records, awaits every ack, and only later commits its offset,
so whatever C_p covers is in snapshot (2); and whatever snapshot (2) holds came from
timeline records that exist in snapshot (3).

A recomputed release of counter c at tick t, from the timeline record at (p, o), is DUE
(it must be published, byte for byte) when

  - o < C_p (its record is committed), or
  - t <= T_c, the highest tick of c's releases in the published snapshot: one counter's
    releases go to one partition, in tick order, each batch's after the previous batch's
    acks, so the published releases of a counter are always a prefix of its recomputed
    ones (a re-executed batch re-sends identical records).

A recomputed ledger entry is due when its record is committed (o < C_p): ledger entries
and releases go to different topics, whose acks are not ordered.

Everything else recomputed is PENDING: not yet due (a backlog the worker has not applied,
a marker appended during a clean shutdown and never applied, a batch cut short by a kill
-9). Pending records are counted in the verdict, never flagged.

One case lets a committed offset run ahead of what was published: around a rebalance Faust
may commit past records it skipped, which the worker re-reads (acks.GapGuard) and applies
at its next record. So a due record missing from the snapshot gets a grace period
(`settle_s`, default 5 s): if it arrives identical meanwhile it is no difference.

A DIFFERENCE is any of: a due record not published ("missing"); a published record that
replay does not recompute ("unexpected", e.g. a forged ledger entry); a published record
whose bytes differ from the recomputed one ("different", e.g. a tampered value); one
(counter, tick, kind) or ledger key published with two different contents
("conflicting"); a published value that is not a release or ledger record ("malformed");
a user-mode entry stating a smaller unit_delta_total than the families' gate records
imply, or a family record above its selection_delta ("understated": recomputed from the
ledger alone by `gate_totals`, docs/open-keys.md). A family's record is written at start
and not recomputed. Identical re-sends (after a crash) count once.

Configuration changes
---------------------
A counter keeps the parameters and noise identity it was created with; replay takes from
the published ledger what the timeline cannot tell (what each counter ran under, and where
a restart under a new configuration was) and recomputes everything else from the timeline
and the key (`history`, `recompute`). A published release whose fingerprint no entry of
its counter announced by its tick is "unexplained".

The modules: `report` (the verdict's vocabulary), `history` (the ledger's account and the
operator's provenance from it), `recompute` (the timeline through the worker's code),
`comparison` (recomputed against published), `partitioned` (one timeline partition at a
time: recomputed, compared with its counters' published records, let go), `gate_totals`
(the ledger's totals beside open families, from the ledger alone), `snapshot` (the cut
against the brokers), `cli` (the command).
"""

from __future__ import annotations

from processor.stream.replay.cli import main_replay
from processor.stream.replay.comparison import compare
from processor.stream.replay.history import LedgerHistory, LedgerProvenance, ledger_history
from processor.stream.replay.recompute import (
    Progress,
    Recomputed,
    default_jobs,
    ledger_operator,
    recompute_timeline,
    single_threaded,
)
from processor.stream.replay.report import (
    CUT_DEFINITION,
    Difference,
    RecordKey,
    ReplayReport,
    Tally,
)
from processor.stream.replay.snapshot import ReplayError, replay

__all__ = [
    "CUT_DEFINITION",
    "Difference",
    "LedgerHistory",
    "LedgerProvenance",
    "Progress",
    "Recomputed",
    "RecordKey",
    "ReplayError",
    "ReplayReport",
    "Tally",
    "compare",
    "default_jobs",
    "ledger_history",
    "ledger_operator",
    "main_replay",
    "recompute_timeline",
    "replay",
    "single_threaded",
]
