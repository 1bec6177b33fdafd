"""The native samplers (the `dpc_native` extension, built from native/), or None.

The extension makes exactly the draws of scalar._discrete_laplace from the same keystream
words (the same values, the same words consumed, the same cursor position after each
draw; tests/core/test_native_samplers.py checks it against the reference), and the SVT's
plan (svt.SVT._sample's float path, the same float operations through the same libm). The Python
samplers stay the reference; scalar.py calls the extension where it is loaded.

`DPC_SAMPLERS` chooses, read once at import: "auto" (the default) uses the extension when
it is installed, "reference" never uses it, "native" requires it (an ImportError at start
if it is missing; CI sets it, so the tests run the native path).
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol, cast

__all__ = ["NATIVE", "SAMPLERS_ENV", "Native", "load"]

SAMPLERS_ENV = "DPC_SAMPLERS"
_MODES = ("auto", "reference", "native")


class Native(Protocol):
    """What the extension provides (native/src/lib.rs)."""

    def discrete_laplace_run(self, key: bytes, lane: int, position: int, t: int, s: int,
                             n: int) -> list[int]:
        """Up to n draws from `position`, flat: value, position after, ...; fewer when
        the next draw is left to the reference (a rare branch or the lane's end)."""

    def keystream(self, key: bytes, lane: int, start: int, n: int) -> bytes:
        """n words of the lane from word `start`, little-endian bytes."""

    def discrete_laplace_attempts(
            self, key: bytes, lane: int, position: int, a: int, t: int, s: int
    ) -> tuple[list[int], list[int], list[tuple[int, int, int, bool, int, int]], int] | None:
        """block._run_attempts(a, t, s) on the lane's words from `position`: the offsets
        and samples of the attempts that produced one, the parked attempts, the position
        after; None past the lane's end (1 <= t <= 2^48)."""

    def svt_plan(self, key: bytes, pos: int, v: int, start: int, end: int, tau: float,
                 b8: float, c: int, z0: int, t1: int, lam: float, log1pq: float, g: float
                 ) -> tuple[int | None, int] | None:
        """svt.SVT._sample(v, start, end, pos) on lane 0 of the skip stream's `key` with
        the instance's constants: (firing step or None, position after); None where the
        reference must run it (its decimal path, a draw the extension leaves)."""


#: What the extension must provide (Native's methods): an extension built from older
#: sources lacks some, and is not used.
FUNCTIONS = ("discrete_laplace_run", "keystream", "discrete_laplace_attempts", "svt_plan")


def load(mode: str) -> Native | None:
    """The extension under `mode` (one of _MODES). One built from older sources (a
    function of FUNCTIONS missing) counts as not installed."""
    if mode not in _MODES:
        raise ImportError(f"{SAMPLERS_ENV}={mode!r}: expected one of {', '.join(_MODES)}")
    if mode == "reference":
        return None
    try:
        module = importlib.import_module("dpc_native")
        missing = [f for f in FUNCTIONS if not callable(getattr(module, f, None))]
        if missing:
            raise ImportError(f"the dpc_native extension lacks {', '.join(missing)}: it "
                              "was built from older sources")
    except ImportError as exc:
        if mode == "native":
            raise ImportError(f"{SAMPLERS_ENV}=native but the dpc_native extension is not "
                              f"usable ({exc}; bash deploy/setup.sh builds it)") from None
        return None
    return cast(Native, module)


NATIVE: Native | None = load(os.environ.get(SAMPLERS_ENV, "auto"))
