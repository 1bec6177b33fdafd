"""W, the wrapper for streams that end (Appendix D): hides the exact length of the stream.

W runs ECC with (eps/2, delta/2). When the end of the stream arrives, `end()` feeds C
more ⊥ ticks (releasing each) and halts, with

    C = max(0, 2 + ceil(2 ln(1/delta) / eps) + Z),   Z ~ DLap(2/eps) on the integers.

The paper has C = max(0, 1 + 2 ln(1/delta)/eps + ceil(U)), U ~ Lap(2/eps). Two deliberate
changes, both on the safe side:
- ceil(U) is replaced by an exact discrete Laplace Z with scale 2/eps (drawn from the
  keyed generator; the scale is rounded up to t/s = ceil(2/eps * UNIT) / UNIT). The proof
  uses two properties of ceil(U): neighbouring values have probability ratio within
  e^{eps/2} (true for Z: P(z)/P(z+1) = e^{-s/t} or e^{s/t}, s/t <= eps/2), and the lower
  tail beyond about -2 ln(1/delta)/eps has probability <= delta/2. For Z,
  P(Z <= -k) = e^{-k s/t} / (1 + e^{-s/t}); with the extra tick below, k exceeds that
  cut-off by one, so the tail is at most delta^{(2/eps)(s/t)} e^{-s/t}/(1 + e^{-s/t})
  < delta^{(2/eps)(s/t)} / 2. (2/eps)(s/t) is 1 up to the rounding of the scale, and the
  rounding is covered exactly: with a = s/t and x = (2/eps) a, 1 - x = (t - 2 UNIT/eps)/t
  < 1/t, so delta^x e^{-a}/(1 + e^{-a}) <= delta/2 iff delta^{x-1} <= (1 + e^a)/2, which
  follows from delta^{x-1} < e^{ln(1/delta)/t} <= e^{a/2} <= (1 + e^a)/2 whenever
  ln(1/delta) <= UNIT/2 (any float delta > 0 has ln(1/delta) < 745). So the tail is at
  most delta/2 exactly.
- the real shift 1 + 2 ln(1/delta)/eps (C must be a whole number of ticks) is rounded up
  and one extra tick is added, so every tail event of the proof is at least as rare as
  with the paper's continuous U. Only more padding, never less.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Self

from processor.core.api import Change, Counter, check_skip
from processor.core.ecc import ECC
from processor.core.errors import InvalidInputError, StateFormatError, state_error_detail
from processor.core.grid import UNIT, to_units
from processor.core.params import ecc_parameters
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import discrete_laplace, laplace_scale_units
from processor.core.state import pack, unpack

_VERSION = 1


def w_padding_shift(eps: float, delta: float) -> int:
    """The public part of C: 2 + ceil(2 ln(1/delta) / eps)."""
    return 2 + math.ceil(2.0 * math.log(1.0 / delta) / eps)


class W(Counter):
    """ECC(eps/2, delta/2) plus a randomised number of ⊥ ticks at the end of the stream."""

    mechanism: ClassVar[str] = "w"
    edit_private: ClassVar[bool] = True

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "",
                 **params: Any) -> None:
        ecc_parameters(eps, delta)  # validates (eps, delta) themselves, not only the halves
        self._inner = ECC(eps / 2.0, delta / 2.0, key, f"{counter_id}/w", **params)
        self.eps = float(eps)
        self.delta = float(delta)
        self.counter_id = counter_id
        self._key = key
        self._ended = False

    @property
    def t(self) -> int:
        return self._inner.t

    @property
    def y(self) -> float:
        return self._inner.y

    @property
    def ended(self) -> bool:
        """True once end() has run: the instance accepts nothing more."""
        return self._ended

    def _check_open(self, x: object) -> None:
        if self._ended:
            raise InvalidInputError(x, "the stream has ended (W.end() was called)")

    def update(self, x: float | None) -> float:
        self._check_open(x)
        to_units(x)  # validate before touching anything
        return self._inner.update(x)

    def skip(self, n: int) -> list[Change]:
        check_skip(n)
        self._check_open(None)
        return self._inner.skip(n)

    def next_due(self) -> int | None:
        return None if self._ended else self._inner.next_due()

    def padding(self) -> int:
        """C: the number of ⊥ ticks end() feeds (a deterministic draw from the key)."""
        cur = WordCursor(KeyedStream(self._key, f"{self.counter_id}/w/end"))
        z = discrete_laplace(cur, laplace_scale_units(2.0 / self.eps), UNIT)
        return max(0, w_padding_shift(self.eps, self.delta) + z)

    def end(self) -> list[float]:
        """Feed C more ⊥ ticks, return their releases y_{t+1}, ..., y_{t+C}, and halt."""
        self._check_open(None)
        c = self.padding()
        out = [self._inner.update(None) for _ in range(c)]
        self._ended = True
        return out

    def to_bytes(self) -> bytes:
        return pack(self.mechanism, _VERSION, {
            "eps": self.eps, "delta": self.delta, "id": self.counter_id,
            "end": self._ended, "inner": self._inner.to_bytes().hex()})

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self:
        st = unpack(data, cls.mechanism, _VERSION)
        try:
            obj = cls.__new__(cls)
            obj._inner = ECC.from_bytes(bytes.fromhex(st["inner"]), key)
            obj.eps = float(st["eps"])
            obj.delta = float(st["delta"])
            obj.counter_id = str(st["id"])
            obj._key = key
            obj._ended = bool(st["end"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StateFormatError):
                raise
            raise StateFormatError(f"w state is invalid: {state_error_detail(exc)}") from None
        if obj._inner.eps != obj.eps / 2.0 or obj._inner.delta != obj.delta / 2.0:
            raise StateFormatError("w state: inner parameters do not match")
        return obj

    def bound_key(self) -> tuple[object, ...]:
        # the inner ECC's own key: its calibration and base change the bound too
        return (self.mechanism, self.eps, self.delta, *self._inner.bound_key())

    def error_bound(self, beta: float = 0.05) -> float:
        """The inner ECC(eps/2, delta/2)'s per-tick bound at the current tick (the padding
        ticks of end() are ⊥ ticks of the inner ECC, covered the same way)."""
        return self._inner.error_bound(beta)

    def error_bound_at(self, t: int, beta: float = 0.05) -> float:
        return self._inner.error_bound_at(t, beta)
