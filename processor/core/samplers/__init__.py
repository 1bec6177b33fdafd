"""Exact samplers on the integers, fed only by the keyed generator of rng.py.

Modules by kind: `scalar` (one draw at a time from a WordCursor, and the
calibration of a scale to grid units), `block` (the vectorised discrete Laplace block
sampler and LaplaceBank), `tails` (closed-form tail probabilities of the discrete
Laplace), `native` (the Rust discrete Laplace run of native/, which `scalar` calls where
it is installed: the same draws from the same words, in 64- and 128-bit integers; the
Python code is the reference it is tested against bit for bit). Import from the module
itself; this package re-exports nothing.

Every draw reads uniform 64-bit words from a `WordCursor` (scalar samplers) or directly
from a `KeyedStream` lane (the vectorised block sampler), so a draw is a deterministic
function of (key, label, lane, position) and is reproduced exactly after a crash.

The exact samplers follow Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1-3, using only Python integers and integer comparisons:
no floating point touches their output distribution, so P(output = z) is exactly the
stated probability (given uniform words).

Conventions shared by all samplers:
- A sampler whose outcome is certain (probability 0 or 1, or m == 1) consumes no words.
- Otherwise every "uniform integer below m" reads whole 64-bit words, so words are never
  split between two draws: either the top bitlen(m-1) bits of a word, retried while
  >= m (uniform_below), or, where one word must decide at once, w mod m with w rejected
  (redrawn) when w >= 2^64 - (2^64 mod m) (the block sampler and Bernoulli(exp(-1))).
  Both are exact rejection sampling: a rejected word is simply never used.
- Bernoulli(exp(-1)), the inner loop of every discrete Laplace draw, is decided from one
  word in all but ~1e-16 of cases (von Neumann's K from 18!/k! thresholds) and continued
  exactly otherwise.

There are no float samplers: every draw is exact. (The SVT's skip path compares lazily
refined uniforms with float bounds first, but decides only when the decision is certain;
see svt.py.)
"""

