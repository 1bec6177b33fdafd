"""HeapTrim (processor/stream/worker/heap.py): the heap is trimmed once enough values
were written, and the trim hands freed memory back (glibc). OldGeneration: no full
collection runs by CPython's rule once installed (control: one runs without it), and its
`collect` reclaims a cycle that the young collections never reach. Deterministic: no
timing."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from processor.stream.worker.heap import HeapTrim, OldGeneration, malloc_trim


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


@pytest.fixture
def collector() -> Iterator[list[int]]:
    """gc enabled with its default thresholds; the generations of the collections run
    meanwhile."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()


def _promote_many(seen: list[int]) -> list[list[int]]:
    """After a full collection (then `seen` emptied): containers that stay alive, more
    than a quarter of what the oldest generation held after it: CPython's rule runs a
    full collection on its own."""
    gc.collect()
    del seen[:]
    n = len(gc.get_objects(2)) // 2 + 100_000
    return [[i] for i in range(n)]


def test_installed_no_full_collection_runs_by_cpythons_rule(collector: list[int]) -> None:
    old = OldGeneration()
    old.install()
    try:
        kept = _promote_many(collector)
        assert 2 not in collector and 0 in collector  # young collections go on
    finally:
        old.uninstall()
    assert gc.get_threshold() == (700, 10, 10)
    del kept


def test_control_without_it_a_full_collection_runs(collector: list[int]) -> None:
    kept = _promote_many(collector)
    assert 2 in collector
    del kept


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_collect_reclaims_a_cycle_in_the_oldest_generation(collector: list[int]) -> None:
    old = OldGeneration()
    old.install()
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        gc.collect()  # alive: now in the oldest generation
        del a, b, collector[:]
        for _ in range(5):  # many young collections and promotions since
            kept = [[i] for i in range(100_000)]
        del kept
        gc.collect(1)
        assert 0 in collector and 2 not in collector
        assert gone() is not None  # the young collections never reach it
        old.collect()
        assert gone() is None and old.collections == 1
    finally:
        old.uninstall()
