"""HeapTrim (processor/stream/worker/heap.py): the heap is trimmed once enough values
were written, and the trim hands freed memory back (glibc). Deterministic: no timing."""

from __future__ import annotations

import pytest

from processor.stream.worker.heap import HeapTrim, malloc_trim


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_trim_only_after_the_threshold_of_writes_then_anew() -> None:
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    heap = HeapTrim(threshold=100, trim=trim)
    heap.written(60)
    heap.after_flush()
    assert calls == []
    heap.written(40)
    heap.after_flush()
    assert calls == [0] and heap.trims == 1
    heap.after_flush()  # nothing written since
    heap.written(99)
    heap.after_flush()
    assert calls == [0]


@pytest.mark.skipif(malloc_trim() is None, reason="no malloc_trim in this C library")
def test_the_trim_hands_freed_values_back() -> None:
    """200,000 values of 1 KB (a checkpoint's encoded counters), one in 16 kept (the
    values that stay, between them), the others freed: their pages stay in the process
    (control: freeing gave back less than a quarter of them) until the trim hands back
    more than half of their 190 MB."""
    values = [bytes(1000) + i.to_bytes(8, "little") for i in range(200_000)]
    start = _rss_mib()
    keep = values[::16]
    del values
    freed = _rss_mib()
    assert start - freed < 190 / 4
    heap = HeapTrim(threshold=1)
    heap.written(1)
    heap.after_flush()
    assert heap.trims == 1
    assert freed - _rss_mib() > 95
    assert len(keep) == 12_500
