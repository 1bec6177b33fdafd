"""Giving the heap's freed memory back to the system after checkpoints that wrote many
values.

A first start that creates a million counters, or a full checkpoint that writes every
one, encodes a value of about 1 KB per counter and frees it once written. glibc's malloc
keeps such freed chunks inside its heap, so the process's RSS stays at that peak for
good (about a gigabyte at 1,000,000 counters; bench/README.md). `malloc_trim(0)` hands
the free pages back. Where the C library has no such call, nothing happens.

And the cyclic garbage collector's full collections, on a timer rather than by CPython's
count of promoted objects (`OldGeneration`): a worker of a million idle counters spent
39% of its Python time in them (bench/README.md).
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import Final

#: Values written since the last trim that make the next flush trim (a periodic
#: checkpoint of an idle worker writes a few thousand: no trim for those).
TRIM_WRITES: Final = 50_000


def malloc_trim() -> Callable[[int], int] | None:
    """The C library's malloc_trim, if it has one."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class HeapTrim:
    """Counts the values written (`written`); `after_flush` trims the heap once at least
    `threshold` were written since the last trim."""

    def __init__(self, threshold: int = TRIM_WRITES,
                 trim: Callable[[int], int] | None = None) -> None:
        self.threshold = threshold
        self._trim = trim if trim is not None else malloc_trim()
        self._since = 0
        #: How many trims ran (a test hook).
        self.trims = 0

    def written(self, n: int) -> None:
        self._since += n

    def after_flush(self) -> None:
        """Once the written values are acknowledged (freed by the producer as well)."""
        if self._since < self.threshold or self._trim is None:
            return
        self._since = 0
        self._trim(0)  # ctypes releases the GIL meanwhile
        self.trims += 1


#: How often the worker's oldest generation is collected (`OldGeneration`): what cyclic
#: garbage reached it waits at most this long.
FULL_COLLECTION_S: Final = 120.0


class OldGeneration:
    """The worker's cyclic garbage collector: the young generations as CPython runs them,
    the oldest one on a timer (`collect`, every FULL_COLLECTION_S) instead of whenever
    the objects promoted into it since the last full collection number a quarter of
    those it held then.

    CPython's rule counts objects, not their size. A worker holding a million idle
    counters holds them in a few huge containers (the operator's maps, its idle entries:
    each one object to that count, a million entries to traverse), while every marker
    promotes its releases, alive until the batch is sent, into the oldest generation: a
    full collection then ran over and over, traversing all of it and reclaiming
    nothing (1,000,000 idle counters catching up: 39% of the samples of the thread
    holding the GIL; those releases are freed by their reference counts). `install`
    sets the threshold of the oldest generation out of reach; `collect` runs a full
    collection."""

    def __init__(self) -> None:
        #: The thresholds before `install` (what `uninstall` puts back).
        self._saved: tuple[int, int, int] | None = None
        #: Full collections run by `collect` (a test hook).
        self.collections = 0

    def install(self) -> None:
        young, middle, old = gc.get_threshold()
        if self._saved is None:
            self._saved = (young, middle, old)
        gc.set_threshold(young, middle, 1 << 30)

    def uninstall(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    def collect(self) -> int:
        """A full collection now; returns what it reclaimed (gc.collect)."""
        self.collections += 1
        return gc.collect()
