"""The vectorised discrete Laplace block sampler and LaplaceBank: n draws at once from a
KeyedStream lane, the same law as scalar.discrete_laplace (conventions in the package
docstring)."""

from __future__ import annotations

import array
import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from processor.core.errors import InvalidParameterError
from processor.core.rng import KeyedStream, WordCursor
from processor.core.samplers.native import NATIVE
from processor.core.samplers.scalar import (
    F18,
    F18_LIMIT_INT,
    U64_MAX,
    VN_THRESHOLDS,
    bern_frac,
    bernoulli_exp_minus_one,
    check_int,
    discrete_laplace,
)

__all__ = ["BLOCK_MAX_T", "LaplaceBank", "discrete_laplace_block"]

#: Largest t the vectorised block sampler accepts; beyond it the scalar path is used.
#: Why: the block computes 2t, t * K (K < 40 von Neumann steps) and U + t * V (V < 40)
#: in uint64; with t <= 2^48 these stay far below 2^63.
BLOCK_MAX_T = 1 << 48

# Columns of the first vectorised sub-pass: von Neumann steps for exp(-U/t), and
# Bernoulli(exp(-1)) trials of the geometric V.
_VN_COLUMNS = 2
_GEOMETRIC_COLUMNS = 3
# Later sub-passes see few attempts, so their cost is per call, not per element: give them
# more columns, so that one of them almost always finishes the loop.
_VN_COLUMNS_LATER = 4
_GEOMETRIC_COLUMNS_LATER = 5
_MAX_SUB = 8  # sub-passes of either loop before a trial is parked for the scalar code
_MAX_PASSES = 3  # batches of attempts in the vectorised region

# Bernoulli(exp(-1)) from one word, vectorised (see bernoulli_exp_minus_one).
_F18_LIMIT = np.uint64(F18_LIMIT_INT)
_VN_THRESH = np.array(VN_THRESHOLDS, dtype=np.uint64)

# Stages of an attempt parked for the scalar code.
_PARKED_IN_VN = 1  # inside the von Neumann loop for Bernoulli(exp(-U/t)) at step k
_PARKED_IN_GEOMETRIC = 2  # inside the geometric V with v successes; k > 0: in exp(-1), step k


def _limit(m: int) -> int:
    """The largest word accepted when drawing uniform mod m from one word.

    A word w is accepted iff w < 2^64 - (2^64 mod m); then w mod m is exactly uniform on
    [0, m). A rejected word is simply a redraw, so skipping it never biases anything.
    """
    return U64_MAX - (1 << 64) % m


def _resume_attempt(cur: WordCursor, t: int, s: int, stage: int, u: int, neg: bool, k: int,
                    v: int) -> int | None:
    """Finish one parked attempt exactly (scalar code): its sample, or None if rejected."""
    if stage == _PARKED_IN_VN:
        while bern_frac(cur, u, t * k):
            k += 1
        if k % 2 == 0:  # Bernoulli(exp(-U/t)) failed: the attempt is rejected
            return None
        v, k = 0, 0
    if k > 0:
        while bern_frac(cur, 1, k):
            k += 1
        more = k % 2 == 1
    else:
        more = bernoulli_exp_minus_one(cur)
    while more:
        v += 1
        more = bernoulli_exp_minus_one(cur)
    y = (u + t * v) // s
    if neg and y == 0:  # "minus zero" is rejected as in CKS
        return None
    return -y if neg else y


class _Words:
    """Consecutive words of one lane, fetched in large slices, handed out by position."""

    __slots__ = ("buf", "buf_start", "lane", "pos", "stream")

    def __init__(self, stream: KeyedStream, lane: int, prefetch: int) -> None:
        self.stream = stream
        self.lane = lane
        self.pos = 0
        self.buf = stream.words(lane, 0, max(prefetch, 1))
        self.buf_start = 0

    def take(self, n: int) -> npt.NDArray[np.uint64]:
        if self.pos + n > self.buf_start + len(self.buf):
            self.buf = self.stream.words(self.lane, self.pos, max(n, len(self.buf)))
            self.buf_start = self.pos
        i = self.pos - self.buf_start
        self.pos += n
        out: npt.NDArray[np.uint64] = self.buf[i: i + n]
        return out


def _run_attempts(src: _Words, a: int, t: int, s: int, m_tab: npt.NDArray[np.uint64],
                  lim_tab: npt.NDArray[np.uint64]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                             list[tuple[int, int, int, bool, int, int]]]:
    """Run `a` independent attempts of CKS Algorithm 2, vectorised.

    Returns (ok, values, parked): the offsets (0..a-1) of the attempts that produced a
    sample and those samples, in attempt order, and the attempts left unfinished by the
    bounded loops as (offset, stage, U, negative, k, v) for _resume_attempt. Every other
    attempt was rejected (exp(-U/t) failed, or "minus zero").

    Words of a sub-pass are laid out column by column (word c * n + i is column c of
    attempt i), so each column is a contiguous vector; any fixed layout is equally exact.
    """
    u64 = np.uint64
    one = u64(1)
    parked: list[tuple[int, int, int, bool, int, int]] = []

    # U and the sign from one word each; a rejected word is a rejected attempt (a redraw).
    w0 = src.take(a)
    r0 = w0 % u64(2 * t)
    uu = r0 >> one
    neg = (r0 & one) == one
    acc0 = w0 <= u64(_limit(2 * t))

    # Bernoulli(exp(-U/t)): von Neumann step k is Bernoulli(U / (t k)).
    d_ids = np.arange(a, dtype=np.int64) if acc0.all() else np.flatnonzero(acc0)
    d_u = uu[d_ids]
    d_k = np.ones(len(d_ids), dtype=np.int64)
    passed: list[npt.NDArray[np.int64]] = []
    for sub in range(_MAX_SUB):
        nd = len(d_ids)
        if nd == 0:
            break
        ncol = _VN_COLUMNS if sub == 0 else _VN_COLUMNS_LATER
        wd = src.take(nd * ncol).reshape(ncol, nd)
        run = np.ones(nd, dtype=bool)  # every step so far succeeded
        stuck = np.zeros(nd, dtype=bool)  # a rejected word: redo that step
        f = np.zeros(nd, dtype=np.int64)  # successes in this sub-pass
        for c in range(ncol):
            w = wd[c]
            if sub == 0:  # every attempt starts at step 1: one modulus per column
                m, lim = m_tab[1 + c], lim_tab[1 + c]
            else:
                m, lim = m_tab[d_k + c], lim_tab[d_k + c]
            ok = w % m < d_u
            acc = w <= lim
            if not acc.all():  # rare: w rejected with probability < t k / 2^64
                stuck |= run & ~acc
                ok &= acc
            run &= ok
            f += run
        k_stop = d_k + f  # the step that failed, was rejected, or comes next
        decided = ~(run | stuck)
        passed.append(d_ids[decided & ((k_stop & 1) == 1)])  # K odd: exp(-U/t) passed
        cont = ~decided
        d_k = k_stop[cont]
        d_ids = d_ids[cont]
        d_u = d_u[cont]
    for j, k in zip(d_ids.tolist(), d_k.tolist(), strict=True):
        parked.append((j, _PARKED_IN_VN, int(uu[j]), bool(neg[j]), k, 0))

    # V: Bernoulli(exp(-1)) successes before the first failure, one word per trial.
    v_ids = np.concatenate(passed) if passed else np.empty(0, dtype=np.int64)
    v_v = np.zeros(len(v_ids), dtype=np.int64)
    done_ids: list[npt.NDArray[np.int64]] = []
    done_v: list[npt.NDArray[np.int64]] = []
    f18 = u64(F18)
    for sub in range(_MAX_SUB):
        nv = len(v_ids)
        if nv == 0:
            break
        ncol = _GEOMETRIC_COLUMNS if sub == 0 else _GEOMETRIC_COLUMNS_LATER
        wv = src.take(nv * ncol).reshape(ncol, nv)
        run = np.ones(nv, dtype=bool)
        stuck = np.zeros(nv, dtype=bool)  # rejected word (fresh redraw) or K > 18
        deep = np.zeros(nv, dtype=bool)  # K > 18: continue von Neumann at k = 19
        f = np.zeros(nv, dtype=np.int64)
        for c in range(ncol):
            w = wv[c]
            # thresholds <= r; K = 19 - nle; K odd (nle even) is a success; nle == 0: K > 18
            nle = np.searchsorted(_VN_THRESH, w % f18, side="right")
            ok = (nle & 1) == 0
            dec = (w <= _F18_LIMIT) & (nle > 0)
            if not dec.all():  # rare: < 4e-4 per word
                und = run & ~dec
                stuck |= und
                deep |= und & (w <= _F18_LIMIT)
                ok &= dec
            run &= ok
            f += run
        vf = v_v + f
        fin = ~(run | stuck)
        done_ids.append(v_ids[fin])
        done_v.append(vf[fin])
        if deep.any():
            for j, v in zip(v_ids[deep].tolist(), vf[deep].tolist(), strict=True):
                parked.append((j, _PARKED_IN_GEOMETRIC, int(uu[j]), bool(neg[j]), 19, v))
        cont = run | (stuck & ~deep)  # all succeeded, or a rejected word (redraw it)
        v_v = vf[cont]
        v_ids = v_ids[cont]
    for j, v in zip(v_ids.tolist(), v_v.tolist(), strict=True):
        parked.append((j, _PARKED_IN_GEOMETRIC, int(uu[j]), bool(neg[j]), 0, v))

    if not done_ids:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), parked
    ids = np.concatenate(done_ids)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    vs = np.concatenate(done_v)[order].astype(np.uint64)
    y = ((uu[ids] + u64(t) * vs) // u64(s)).astype(np.int64)
    ng = neg[ids]
    keep = ~(ng & (y == 0))  # "minus zero" rejects the attempt
    return ids[keep], np.where(ng, -y, y)[keep], parked


@lru_cache(maxsize=64)
def _block_tables(t: int, s: int, ld: int, max_sub: int
                  ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], float]:
    """Per-scale constants of the block sampler: the modulus t k of von Neumann step k and
    its acceptance limit (index k; entry 0 unused), and the acceptance probability of one
    attempt, P(exp(-U/t) passes) * P(not "minus zero"), used only to size batches."""
    ks = range(2 + ld * (max_sub + 1))
    m_tab = np.array([t * max(k, 1) for k in ks], dtype=np.uint64)
    lim_tab = np.array([_limit(t * max(k, 1)) for k in ks], dtype=np.uint64)
    p_acc = (-math.expm1(-1.0)) / (t * -math.expm1(-1.0 / t))
    p_acc *= 1.0 - 0.5 * -math.expm1(-s / t)
    return m_tab, lim_tab, p_acc


def discrete_laplace_block(stream: KeyedStream, lane: int, t: int, s: int, n: int
                           ) -> npt.NDArray[np.int64]:
    """n independent samples of discrete_laplace(t, s), exactly, as an int64 array.

    A pure function of (stream, lane, t, s, n): it reads the words of `lane` from word 0,
    in an order fixed by the words themselves. CKS Algorithm 2 is rejection sampling: a
    sequence of independent attempts, each rejected or producing a sample, and the samples
    of the accepted attempts, in attempt order, are independent DLap(t/s) draws. The block
    runs many attempts at once with numpy integer operations:

    - one word per attempt gives U and the sign: r = w mod 2t, U = r >> 1, sign = r & 1
      (the sign is independent of U, so drawing it first does not change the law);
    - Bernoulli(exp(-U/t)) by von Neumann's loop, whose step k is Bernoulli(U / (t k)),
      i.e. (w mod t k) < U, _VN_COLUMNS steps in the first vectorised sub-pass,
      _VN_COLUMNS_LATER later;
    - V, the number of Bernoulli(exp(-1)) successes before a failure, each Bernoulli from
      one word (see _VN_THRESH), _GEOMETRIC_COLUMNS of them in the first sub-pass,
      _GEOMETRIC_COLUMNS_LATER later.

    Every uniform comes from its own fresh word by exact rejection (see _limit). The
    unbounded loops run vectorised for at most _MAX_SUB sub-passes; attempts still
    unfinished are parked with their exact state. After the vectorised region (at most
    _MAX_PASSES batches of attempts), the scalar code completes the parked attempts in
    attempt order, reading the words of the lane that follow, and the output is the first
    n accepted attempts in attempt order; if there are fewer than n, the rest are fresh
    scalar draws from the same cursor. So every output has exactly the DLap(t/s) law and
    the outputs are independent.

    Limit: t <= BLOCK_MAX_T (2^48) keeps the uint64 arithmetic exact; a larger t falls
    back to n scalar draws on a cursor over the same lane.
    """
    t = check_int("t", t, 1)
    s = check_int("s", s, 1)
    n = check_int("n", n, 0)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    if t > BLOCK_MAX_T:
        cur = WordCursor(stream, lane, 0)
        for i in range(n):
            out[i] = discrete_laplace(cur, t, s)
        return out

    m_tab, lim_tab, p_acc = _block_tables(t, s, max(_VN_COLUMNS, _VN_COLUMNS_LATER), _MAX_SUB)

    # The attempts run in the extension where it is loaded (the same words, decisions and
    # position after: tests/core/test_native_samplers.py), else on the words of `src`.
    key = stream.derived_key() if NATIVE is not None and 0 <= lane < 1 << 96 else None
    src: _Words | None = None
    pos = 0  # the lane's words consumed so far
    got_ids: list[npt.NDArray[np.int64]] = [np.empty(0, dtype=np.int64)]
    got_vals: list[npt.NDArray[np.int64]] = [np.empty(0, dtype=np.int64)]
    parked: list[tuple[int, int, int, bool, int, int]] = []
    base = 0  # attempt number of the first attempt of the batch
    have = 0
    for _ in range(_MAX_PASSES):
        need = n - have
        if need <= 0:
            break
        a = math.ceil(need / p_acc + 3.0 * math.sqrt(need) + 4)
        run = (None if key is None or NATIVE is None
               else NATIVE.discrete_laplace_attempts(key, lane, pos, a, t, s))
        if run is not None:
            ok_l, vals_l, pk, pos = run
            ok, vals = np.array(ok_l, dtype=np.int64), np.array(vals_l, dtype=np.int64)
        else:
            if src is None:
                src = _Words(stream, lane, 10 * n)
                src.pos = pos
            ok, vals, pk = _run_attempts(src, a, t, s, m_tab, lim_tab)
            pos = src.pos
        got_ids.append(ok + base)
        got_vals.append(vals)
        parked.extend((j + base, st, u, ng, k, v) for j, st, u, ng, k, v in pk)
        have += len(ok) + len(pk)  # parked attempts may still succeed
        base += a

    ids = np.concatenate(got_ids)
    vals = np.concatenate(got_vals)
    cur = WordCursor(stream, lane, pos)
    if parked:
        extra_ids: list[int] = []
        extra_vals: list[int] = []
        parked.sort()  # attempt order (attempt numbers are unique)
        for j, stage, u, ng, k, v in parked:
            y = _resume_attempt(cur, t, s, stage, u, ng, k, v)
            if y is not None:
                extra_ids.append(j)
                extra_vals.append(y)
        if extra_ids:
            ids = np.concatenate([ids, np.array(extra_ids, dtype=np.int64)])
            vals = np.concatenate([vals, np.array(extra_vals, dtype=np.int64)])
            order = np.argsort(ids, kind="stable")
            vals = vals[order]
    m = min(n, len(vals))
    out[:m] = vals[:m]
    for i in range(m, n):
        out[i] = discrete_laplace(cur, t, s)
    return out


_I32 = np.iinfo(np.int32)


def _compact(samples: npt.NDArray[np.int64]) -> array.array[int]:
    """The samples as an array.array of 4-byte ints when every one fits, else 8-byte."""
    if samples.size and (samples.min() < _I32.min or samples.max() > _I32.max):
        return array.array("q", samples.astype(np.int64).tobytes())
    return array.array("i", samples.astype(np.int32).tobytes())


class LaplaceBank:
    """An addressable, reproducible sequence of DLap(t/s) samples: draw(i) is the i-th.

    Sample i lives in chunk c = i // chunk, computed as
    discrete_laplace_block(stream, lane=c + 1, t, s, chunk) (lane 0 is left to scalar
    cursors). A mechanism stores only the index in its state. draw(i) does not depend on
    the order of calls (a chunk is a pure function of its lane). The two most recently
    used chunks are kept (chunk * 4 bytes each, 8 when a sample needs more than 32
    bits: a counter's SVT keeps one bank, so its samples are most of an active counter's
    memory), so a caller that looks a few draws ahead
    across a chunk boundary (the SVT's ⊥-run prefix) does not recompute the chunk it
    still consumes; sequential use costs one vectorised block per `chunk` draws plus well
    under a microsecond per draw.
    """

    __slots__ = ("_base", "_old", "_old_c", "_vals", "chunk", "s", "stream", "t")

    def __init__(self, stream: KeyedStream, t: int, s: int = 1, chunk: int = 1024) -> None:
        self.stream = stream
        self.t = check_int("t", t, 1)
        self.s = check_int("s", s, 1)
        self.chunk = check_int("chunk", chunk, 1)
        # Samples as a compact array.array: indexing it yields Python ints several times
        # faster than numpy scalars, at 8 bytes per sample.
        self._vals: array.array[int] = array.array("q")
        # Index of the first sample of the current chunk; the initial value is so far
        # below 0 that no index passes the fast-path range check before a chunk exists.
        self._base = -(1 << 80)
        self._old: array.array[int] = array.array("q")  # the previously current chunk
        self._old_c = -1

    def _load(self, c: int) -> None:
        """Make chunk c current (computing it unless it is the previous one)."""
        cur_c = self._base // self.chunk if self._base >= 0 else -1
        if c == cur_c:
            return
        if c == self._old_c:
            vals = self._old
        else:
            if c + 1 >= 1 << 96:
                raise InvalidParameterError("LaplaceBank index out of range")
            vals = _compact(discrete_laplace_block(self.stream, c + 1, self.t, self.s,
                                                   self.chunk))
        if cur_c >= 0:
            self._old, self._old_c = self._vals, cur_c
        self._vals, self._base = vals, c * self.chunk

    def draw(self, index: int) -> int:
        """The index-th sample (index >= 0)."""
        j = index - self._base
        if 0 <= j < self.chunk and type(index) is int:  # the common, sequential case
            return self._vals[j]
        index = check_int("index", index, 0)
        c, j = divmod(index, self.chunk)
        self._load(c)
        return self._vals[j]

    def __repr__(self) -> str:
        return f"LaplaceBank(label={self.stream.label!r}, t={self.t}, s={self.s})"
