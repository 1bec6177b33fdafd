"""Giving the heap's freed memory back to the system after checkpoints that wrote many
values.

A first start that creates a million counters, or a full checkpoint that writes every
one, encodes a value of about 1 KB per counter and frees it once written. glibc's malloc
keeps such freed chunks inside its heap, so the process's RSS stays at that peak for
good (about a gigabyte at 1,000,000 counters; bench/README.md). `malloc_trim(0)` hands
the free pages back. Where the C library has no such call, nothing happens.
"""

from __future__ import annotations

import ctypes
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
