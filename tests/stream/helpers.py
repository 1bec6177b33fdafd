"""Test helpers on the store seam: an operator record applied as its own checkpoint."""

from __future__ import annotations

from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.state import StateStore


def apply_now(op: Operator, store: StateStore, partition: int, offset: int, record: bytes,
              out: Output | None = None, stamp_ms: int | None = None) -> Output:
    """`op.apply` with the record its own checkpoint: applied in a transaction over
    `store`, every change (deferred ones too: `Operator.stage_deferred`) written before
    this returns; a failure to apply fails the transaction."""
    txn = op.transaction(store)
    try:
        out = op.apply(txn, partition, offset, record, out, stamp_ms)
    except BaseException:
        txn.fail()
        raise
    op.stage_deferred(txn, partition)
    store.write_many(txn.prepare())
    txn.complete()
    return out
