"""ECC (Algorithm 2) and SimECC (Section 6): counters private for edit neighbours."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, ClassVar, Self

import orjson

from processor.core.api import Change, Counter, IdleView, check_skip
from processor.core.bounds import ecc_bound, simecc_bound
from processor.core.cc import BCC, UnboundedCC
from processor.core.errors import (
    InvalidParameterError,
    StateFormatError,
    StateParameterError,
    state_error_detail,
)
from processor.core.grid import UNIT, check_units, from_units, to_units

# Re-exported (`X as X`) for processor/commands/plan.py and processor/audit/, which import
# them from here; every other importer takes them from processor.core.params.
from processor.core.params import EccParams, SimEccParams
from processor.core.params import ecc_parameters as ecc_parameters
from processor.core.params import simecc_parameters as simecc_parameters
from processor.core.partition import Part, SimPart, part_tau, simpart_scale
from processor.core.rng import NoiseKey
from processor.core.schedule import SchedList
from processor.core.state import pack_owned, unpack
from processor.core.svt import SVT, svt_scales, svt_threshold
from processor.core.tight import CALIBRATIONS, check_calibration

# ---------------------------------------------------------------------------------------
# The counters
# ---------------------------------------------------------------------------------------

# The paper plan of one (eps, delta) is one object shared by every counter built or
# restored with it: its floats are held once, not once per counter, and a restore computes
# none of them. A tight plan's floats are shared already (tight.py caches its plans, and
# whoever clears that cache must get new plans here too). Typed: True is not served 1.0's
# plan (a bool is refused).


@lru_cache(maxsize=256, typed=True)
def _paper_ecc(eps: float, delta: float) -> EccParams:
    return ecc_parameters(eps, delta)


@lru_cache(maxsize=256, typed=True)
def _paper_simecc(eps: float, delta: float) -> SimEccParams:
    return simecc_parameters(eps, delta)



def _dlap_bound(scale_units: int, beta: float) -> float:
    """k (events) with P(|Z| >= k) <= beta for Z ~ DLap(scale_units) in units:
    P(|Z| >= k) < 2 e^{-k/b}, so k = b ln(2/beta) plus one unit for the lattice."""
    return (scale_units * math.log(2.0 / beta) + 1) / UNIT


def ecc_part_term(eps: float, delta: float, beta: float, t: int,
                  calibration: str = "paper") -> float:
    """The Part term of Theorem 4.3 with explicit constants (events), failure beta.

    In the proof (case 2), the SVT running at some tick t' <= t returned ⊥ there, so its
    intsum is at most its threshold plus |Z_0| + |Z_s|. With l <= t + 1 SVT instances and
    local step s <= t, a union bound with beta_l = 6 beta / (pi^2 l^2) per instance (half
    to Z_0, half to the Z_s with 6 (beta_l/2) / (pi^2 s^2) each) gives
    part_tau(tau, t+1, eps_p) + (8/eps_p) ln(t + ceil(12/eps_p)) + k0 + k1, where k0, k1 are
    the discrete Laplace tail bounds at the actual (rounded-up) scales, plus one unit for
    the floored threshold.
    """
    p = ecc_parameters(eps, delta, calibration)
    t0, t1 = svt_scales(p.eps_part)
    l = t + 1  # noqa: E741
    beta_l = 6.0 * beta / (math.pi**2 * l * l)
    k0 = _dlap_bound(t0, beta_l / 2)
    k1 = _dlap_bound(t1, 6.0 * (beta_l / 2) / (math.pi**2 * t * t))
    return (svt_threshold(p.eps_part, part_tau(p.tau, l, p.eps_part), t) + k0 + k1
            + 1.0 / UNIT)


def simecc_gap_bound(eps: float, delta: float, beta: float, t: int,
                     calibration: str = "paper") -> int:
    """B_{t+1} of Lemma 6.4 with explicit constants (ticks): with probability >= 1 - beta,
    every SimPart gap with index l <= t + 1 is at most mu + ceil(4 ln(l)/eps_p) + k_l, where
    P(Z > k_l) <= beta_l = 6 beta / (pi^2 l^2) for Z ~ DLap at the rounded-up scale b:
    P(Z > k) <= e^{-(k+1)/b}, so k_l = ceil(b ln(1/beta_l)) - 1."""
    p = simecc_parameters(eps, delta, calibration)
    ts, ss = simpart_scale(p.eps_part)
    l = t + 1  # noqa: E741
    beta_l = 6.0 * beta / (math.pi**2 * l * l)
    k = math.ceil(ts / ss * math.log(1.0 / beta_l)) - 1
    return max(1, p.mu + math.ceil(4.0 * math.log(l) / p.eps_part) + k)


class _EccBase(Counter):
    """Algorithm 2 around a partition (Part for ECC, SimPart for SimECC).

    At a checkpoint t_l: t_hat_l = BCC(t_l - t_{l-1}) (whole ticks, never early),
    v_hat_l = CC(intsum_l) (units); v_hat_l is scheduled for t_hat_l; y_t is the largest
    value scheduled at t, else y_{t-1}. Nothing but y leaves the instance: checkpoints,
    intsum and scheduled values are private state.
    """

    __slots__ = ("_bcc", "_cc", "_intsum", "_key", "_part", "_sched", "_t", "_tprev", "_y",
                 "calibration", "counter_id", "delta", "eps")

    edit_private: ClassVar[bool] = True
    #: State format version; bumped whenever the layout or the draws a state implies change
    #: (a restored state must continue with exactly the noise it would have drawn).
    state_version: ClassVar[int] = 1

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "",
                 calibration: str = "paper", **params: Any) -> None:
        if params:
            raise InvalidParameterError(f"unknown parameters {sorted(params)}")
        if not isinstance(counter_id, str):
            raise InvalidParameterError("counter_id must be a string")
        self._setup(eps, delta, key, counter_id, None, check_calibration(calibration))

    def _setup(self, eps: float, delta: float, key: NoiseKey, counter_id: str,
               st: dict[str, Any] | None, calibration: str = "paper") -> None:
        #: "paper" or "tight" (processor.core.tight): which analysis sets CC, BCC and the
        #: partition; stored in the state only when "tight" (older states are "paper").
        self.calibration = calibration
        cc_eps, cc_delta, bcc_eps, bcc_delta = self._constants(eps, delta)
        self.eps = float(eps)
        self.delta = float(delta)
        self.counter_id = counter_id
        self._key = key
        base = f"{counter_id}/{self.mechanism}"
        if st is None:
            self._t = 0
            self._y = 0
            self._tprev = 0
            self._intsum = 0
            self._sched = SchedList()
            self._part = self._new_part(key, base + "/part", None)
            self._cc = UnboundedCC(cc_eps, cc_delta, key, base + "/cc")
            self._bcc = BCC(bcc_eps, bcc_delta, key, base + "/bcc")
        else:
            self._t = int(st["t"])
            self._y = int(st["y"])
            self._tprev = int(st["tp"])
            self._intsum = int(st["s"])
            self._sched = SchedList.from_state(st["sched"])
            self._part = self._new_part(key, base + "/part", st["part"])
            self._cc = UnboundedCC.from_state(st["cc"], key)
            self._bcc = BCC.from_state(st["bcc"], key)
            self._check_plan(base, cc_eps, cc_delta, bcc_eps, bcc_delta)

    def _check_plan(self, base: str, cc_eps: float, cc_delta: float, bcc_eps: float,
                    bcc_delta: float) -> None:
        """A restored CC and BCC carry their own (eps, delta); they must be exactly the
        plan's for the stored (eps, delta, calibration), else the counter would run under
        a guarantee nobody configured (a CC restored at 100 eps adds a tenth of the noise
        and says nothing): StateParameterError. The bases may differ from today's default
        (older tree states) but not from each other (one construction in _setup)."""
        m = self.mechanism
        for field, stored, planned in (
                ("cc eps", self._cc.eps, cc_eps), ("cc delta", self._cc.delta, cc_delta),
                ("cc label", self._cc.label, base + "/cc"),
                ("cc sensitivity", self._cc.sensitivity, UNIT),
                ("bcc eps", self._bcc.eps, bcc_eps), ("bcc delta", self._bcc.delta, bcc_delta),
                ("bcc label", self._bcc.label, base + "/bcc"),
                ("bcc sensitivity", self._bcc.sensitivity, UNIT),
                ("bcc base", self._bcc.base, self._cc.base)):
            if stored != planned:
                raise StateParameterError(m, field, stored, planned)

    # -- hooks for the two variants --------------------------------------------------------

    def _constants(self, eps: float, delta: float) -> tuple[float, float, float, float]:
        raise NotImplementedError

    def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None
                  ) -> Part | SimPart:
        raise NotImplementedError

    # -- the contract ----------------------------------------------------------------------

    @property
    def t(self) -> int:
        return self._t

    @property
    def y(self) -> float:
        return from_units(self._y)

    @property
    def base(self) -> str:
        """The bounded counter inside CC and BCC (one construction in _setup)."""
        return self._cc.base

    @property
    def checkpoints(self) -> int:
        """The partition's checkpoints so far: what a replay of this counter from tick 0
        steps through one by one (`selection.replay`), the rest being jumps."""
        return self._part.l

    def update(self, x: float | None) -> float:
        """Validate x (InvalidInputError, state untouched), then one tick of Algorithm 2."""
        self._tick(to_units(x))
        return self.y

    def update_units(self, u: int) -> float:
        self._tick(check_units(u))
        return self.y

    def _tick(self, u: int) -> None:
        self._t += 1
        self._intsum += u
        if self._part.step(u):
            t_hat = self._bcc.step(self._t - self._tprev)
            v_hat = self._cc.step(self._intsum)
            self._sched.update(t_hat, v_hat)
            self._tprev = self._t
            self._intsum = 0
        r = self._sched.check(self._t)
        if r is not None:
            self._y = r
            self._sched.compact(self._t)

    def next_due(self) -> int | None:
        """min(next checkpoint if only ⊥ follows, next scheduled release); None: never."""
        return self._next_due(None)

    def _next_due(self, limit: int | None) -> int | None:
        """next_due(), or None if it is after tick `limit` (when limit is not None)."""
        a = self._part.next_due(limit)
        b = self._sched.next_after(self._t)
        if a is None:
            return b
        return a if b is None else min(a, b)

    def skip(self, n: int) -> list[Change]:
        """n ⊥ ticks, jumping between the ticks next_due() names: the cost is the number of
        checkpoints and releases inside the range, not n."""
        check_skip(n)
        end = self._t + n
        changes: list[Change] = []
        while self._t < end:
            d = self._next_due(end)
            if d is None or d > end:
                self._advance(end - self._t)
                break
            self._advance(d - 1 - self._t)
            before = self._y
            self._tick(0)
            if self._y != before:
                changes.append((self._t, self.y))
        return changes

    def _advance(self, k: int) -> None:
        if k > 0:
            self._part.advance(k)
            self._t += k

    def to_bytes(self) -> bytes:
        st: dict[str, Any] = {
            "eps": self.eps, "delta": self.delta, "id": self.counter_id,
            "t": self._t, "y": self._y, "tp": self._tprev, "s": self._intsum,
            "sched": self._sched.to_state(), "part": self._part.to_state(),
            "cc": self._cc.to_state(), "bcc": self._bcc.to_state(),
        }
        if self.calibration != "paper":
            st["cal"] = self.calibration
        return pack_owned(self.mechanism, self.state_version, st)

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self:
        st = unpack(data, cls.mechanism, cls.state_version)
        try:
            eps, delta, cid = float(st["eps"]), float(st["delta"]), st["id"]
            if not isinstance(cid, str):
                raise StateFormatError("counter id is not a string")
            cal = st.get("cal", "paper")
            if cal not in CALIBRATIONS:
                raise StateFormatError("unknown calibration in the state")
            obj = cls.__new__(cls)
            obj._setup(eps, delta, key, cid, st, cal)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StateFormatError):
                raise
            raise StateFormatError(
                f"{cls.mechanism} state is invalid: {state_error_detail(exc)}") from None
        return obj

    @classmethod
    def advance_state(cls, data: bytes, k: int, key: NoiseKey | None = None) -> bytes | None:
        """k ⊥ ticks on the encoded state where they draw nothing: nothing scheduled in
        (t, t + k] and the partition quiet through t + k without a draw (`_quiet_part`).
        Then `skip(k)` is one `_advance(k)`, which moves the tick counters only, so the
        result is the bytes `from_bytes(data).skip(k).to_bytes()` gives (the same dict,
        re-encoded in its order; orjson's floats round-trip exactly). A noise key is not
        needed: a state's fields say everything a quiet advance reads.

        With the counter's noise `key`, also where the partition draws (an ECC SVT inside
        its run's dense prefix): the partition alone is restored (`_keyed_part`, as
        `from_bytes` restores it, without CC, BCC and the schedule), and where its
        `next_due(t + k)` is past t + k it takes `advance(k)`, exactly the two calls
        `skip(k)` makes on it; the rest of the state is as above."""
        if k < 0 or bytes(data[:3]) != b"DPS" or len(data) < 5 or data[3] != cls.state_version:
            return None
        try:
            st = orjson.loads(data[4:])
            if not isinstance(st, dict) or st.get("m") != cls.mechanism:
                return None
            t = st["t"]
            part = st["part"]
            if type(t) is not int or type(part) is not dict or type(part.get("t")) is not int:
                return None
            if any(not (type(tick) is int and (tick <= t or tick > t + k))
                   for tick, _v in st["sched"]):
                return None
            if not cls._quiet_part(part, k):
                if key is None or k == 0:
                    return None
                restored = cls._keyed_part(st, key)
                due = restored.next_due(t + k)
                if due is not None and due <= t + k:
                    return None
                restored.advance(k)
                st["t"] = t + k
                st["part"] = restored.to_state()
                return data[:4] + orjson.dumps(st)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, RuntimeError):
            return None
        st["t"] = t + k
        part["t"] += k
        return data[:4] + orjson.dumps(st)

    @classmethod
    def _keyed_part(cls, st: dict[str, Any], key: NoiseKey) -> Part | SimPart:
        """The partition `from_bytes(data, key)` restores from the state dict `st`: the
        same parameters (`_constants` of its eps, delta and calibration), label, key and
        partition state, through the same `_new_part`; CC, BCC and the schedule are not
        built. Raises ValueError, KeyError or TypeError on a state it cannot restore."""
        cal = st.get("cal", "paper")
        cid = st["id"]
        if cal not in CALIBRATIONS or not isinstance(cid, str) or type(st["part"]) is not dict:
            raise ValueError("not a restorable state")
        obj = cls.__new__(cls)
        obj.calibration = cal
        obj._constants(float(st["eps"]), float(st["delta"]))
        return obj._new_part(key, f"{cid}/{cls.mechanism}/part", st["part"])

    @staticmethod
    def _quiet_part(part: dict[str, Any], k: int) -> bool:
        """Whether the partition's state advances k ⊥ ticks by its counters alone (then
        it is advanced in place)."""
        raise NotImplementedError

    @classmethod
    def idle_view(cls, data: bytes, key: NoiseKey | None = None) -> IdleView | None:
        """The view where the partition's next checkpoint is in its state
        (`_planned_part`): next_due() is then the earlier of it and the next scheduled
        release, as `_next_due` computes it. With the counter's noise `key`, also where
        it is not (an ECC SVT inside its run's dense prefix, whose next firing step
        needs the key's draws): then the partition's `next_due()` of the partition alone
        restored (`_keyed_part`), the call `_next_due` makes on it."""
        if bytes(data[:3]) != b"DPS" or len(data) < 5 or data[3] != cls.state_version:
            return None
        try:
            st = orjson.loads(data[4:])
            if not isinstance(st, dict) or st.get("m") != cls.mechanism:
                return None
            t, y, part = st["t"], st["y"], st["part"]
            if type(t) is not int or type(y) is not int or type(part) is not dict:
                return None
            a = cls._planned_part(part)
            if a is False:
                if key is None:
                    return None
                a = cls._keyed_part(st, key).next_due()
            later = [tick for tick, _v in st["sched"] if tick > t]
            if any(type(tick) is not int for tick in later):
                return None
            b = min(later) if later else None
            due = b if a is None else a if b is None else min(a, b)
            eps, delta = float(st["eps"]), float(st["delta"])
            cal = st.get("cal", "paper")
            base = st["bcc"]["cc"]["b"]
            if cal not in CALIBRATIONS or type(base) is not str:
                return None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, RuntimeError):
            return None
        # bound_key() of the restored counter (one definition there).
        return IdleView(cls.mechanism, eps, delta, t, from_units(y), due,
                        (cls.mechanism, eps, delta, cal, base))

    @staticmethod
    def _planned_part(part: dict[str, Any]) -> int | bool | None:
        """The partition's next_due() where its state holds it without a draw (None:
        never), else False."""
        raise NotImplementedError

    def bound_key(self) -> tuple[object, ...]:
        # the bound also depends on the calibration and on the base CC and BCC run on
        # (restored tree states next to new BLT ones)
        return (self.mechanism, self.eps, self.delta, self.calibration, self._bcc.base)

    def error_bound(self, beta: float = 0.05) -> float:
        """Holds with probability >= 1 - beta at the current tick (per tick, not over all
        ticks at once): processor/core/bounds.py, from (eps, delta, calibration, base, t)."""
        return self.error_bound_at(self._t, beta)

    def error_bound_at(self, t: int, beta: float = 0.05) -> float:
        raise NotImplementedError


class ECC(_EccBase):
    """ECC (Algorithm 2): sparsity-adaptive, (eps, delta)-DP for edit neighbours."""

    mechanism: ClassVar[str] = "ecc"
    #: 2: the SVT starts every ⊥ run with svt.PREFIX dense steps (field "r").
    #: 3: the ⊥-run plan is sampled exactly (other words of the skip lane than the float64
    #: sampler of versions 1-2). Older states would continue with other draws: refused.
    state_version: ClassVar[int] = 3

    __slots__ = ("_params",)

    def _constants(self, eps: float, delta: float) -> tuple[float, float, float, float]:
        p = (_paper_ecc(eps, delta) if self.calibration == "paper"
             else ecc_parameters(eps, delta, self.calibration))
        self._params = p
        return p.cc_eps, p.cc_delta, p.bcc_eps, p.bcc_delta

    def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None) -> Part:
        return Part(self._params.eps_part, self._params.tau, key, label, st)

    @staticmethod
    def _quiet_part(part: dict[str, Any], k: int) -> bool:
        # Part's SVT past its run's dense prefix follows its committed plan ("f": the
        # step it fires at, None never): SVT.advance draws nothing then, and moves `n`.
        svt = part["svt"]
        if type(svt) is not dict or "f" not in svt or svt.get("h") is not False:
            return False
        steps, plan = svt["n"], svt["f"]
        if svt.get("r") != SVT.prefix or type(steps) is not int or not (
                plan is None or (type(plan) is int and plan - steps > k)):
            return False
        svt["n"] = steps + k
        return True

    @staticmethod
    def _planned_part(part: dict[str, Any]) -> int | bool | None:
        # Past its run's dense prefix the SVT's committed plan says when it fires
        # (`SVT._due`: f - n steps on; None never), the partition's tick t on from now.
        svt, t = part["svt"], part["t"]
        if (type(svt) is not dict or "f" not in svt or svt.get("h") is not False
                or svt.get("r") != SVT.prefix or type(t) is not int):
            return False
        steps, plan = svt["n"], svt["f"]
        if plan is None:
            return None
        if type(steps) is not int or type(plan) is not int or plan <= steps:
            return False
        return t + plan - steps

    def error_bound_at(self, t: int, beta: float = 0.05) -> float:
        # BCC's base: the same as CC's (one construction in _setup).
        return ecc_bound(self.eps, self.delta, beta, t, self._bcc.base, self.calibration)


class SimECC(_EccBase):
    """SimECC (Section 6): ECC with the data-independent SimPart."""

    mechanism: ClassVar[str] = "simecc"

    __slots__ = ("_sparams",)

    def _constants(self, eps: float, delta: float) -> tuple[float, float, float, float]:
        p = (_paper_simecc(eps, delta) if self.calibration == "paper"
             else simecc_parameters(eps, delta, self.calibration))
        self._sparams = p
        return p.cc_eps, p.cc_delta, p.bcc_eps, p.bcc_delta

    def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None) -> SimPart:
        return SimPart(self._sparams.eps_part, self._sparams.mu, key, label, st)

    @staticmethod
    def _quiet_part(part: dict[str, Any], k: int) -> bool:
        # SimPart draws at its checkpoints only ("c", the next one's tick).
        nxt = part["c"]
        return type(nxt) is int and part["t"] + k < nxt

    @staticmethod
    def _planned_part(part: dict[str, Any]) -> int | bool | None:
        # SimPart's next checkpoint is in its state ("c").
        nxt = part["c"]
        return nxt if type(nxt) is int else False

    def error_bound_at(self, t: int, beta: float = 0.05) -> float:
        # BCC's base: the same as CC's (one construction in _setup).
        return simecc_bound(self.eps, self.delta, beta, t, self._bcc.base, self.calibration)
