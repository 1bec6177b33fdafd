//! Native exact discrete Laplace draws on the keyed ChaCha20 keystream of dp-stream-counts.
//!
//! The Python code is the reference (processor/core/rng.py, processor/core/samplers/
//! scalar.py): this crate makes the same draws from the same words, in the same order,
//! with the same integer decisions, and ends at the same word position. No float is
//! computed anywhere. A draw this crate does not finish (a rare branch it leaves to the
//! reference, or a position past the lane's end) is reported as not done, and the
//! caller makes it with the reference from the position returned.
//!
//! The ChaCha20 key is passed per call and never stored, printed or returned.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Words of one ChaCha20 block (64 bytes).
const WORDS_PER_BLOCK: u64 = 8;
/// Blocks in one lane: the block counter is 32 bits (rng.py refuses beyond it too).
const MAX_BLOCK: u64 = 1 << 32;
/// 18!: the modulus of the one-word Bernoulli(exp(-1)) (scalar.py F18).
const F18: u64 = 6_402_373_705_728_000;
/// The largest word accepted for r = w mod 18! (scalar.py F18_LIMIT_INT).
const F18_LIMIT: u64 = u64::MAX - ((1u128 << 64) % F18 as u128) as u64;

/// von Neumann thresholds 18!/k!, k = 18 down to 1, ascending (scalar.py VN_THRESHOLDS).
const fn vn_thresholds() -> [u64; 18] {
    let mut out = [0u64; 18];
    let mut i = 0;
    while i < 18 {
        // entry i is 18! / (18 - i)!
        let k = 18 - i as u64;
        let mut f: u64 = 1;
        let mut j = 2;
        while j <= k {
            f *= j;
            j += 1;
        }
        out[i] = F18 / f;
        i += 1;
    }
    out
}
const VN_THRESHOLDS: [u64; 18] = vn_thresholds();

/// The ChaCha20 block function (RFC 8439 state layout): key words 4..12, the 32-bit block
/// counter in word 12, the 96-bit nonce (the lane) in words 13..16. On x86-64 its rows in
/// SSE2 registers (every x86-64 processor has SSE2), elsewhere word by word.
#[inline(always)]
fn chacha20_block(key: &[u32; 8], counter: u32, nonce: &[u32; 3], out: &mut [u64; 8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe {
        chacha20_block_sse2(key, counter, nonce, out);
    }
    #[cfg(not(target_arch = "x86_64"))]
    chacha20_block_words(key, counter, nonce, out);
}

/// chacha20_block with the state's four rows as vectors: a column round is one
/// quarter round of the four columns at once, a diagonal round the same after the rows
/// are rotated by 1, 2 and 3 words (and rotated back).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn chacha20_block_sse2(key: &[u32; 8], counter: u32, nonce: &[u32; 3], out: &mut [u64; 8]) {
    use std::arch::x86_64::*;
    let row = |w: [u32; 4]| _mm_set_epi32(w[3] as i32, w[2] as i32, w[1] as i32, w[0] as i32);
    let a0 = row([0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    let b0 = row([key[0], key[1], key[2], key[3]]);
    let c0 = row([key[4], key[5], key[6], key[7]]);
    let d0 = row([counter, nonce[0], nonce[1], nonce[2]]);
    let (mut a, mut b, mut c, mut d) = (a0, b0, c0, d0);
    macro_rules! rotl {
        ($x:expr, 16) => {
            _mm_shufflehi_epi16(_mm_shufflelo_epi16($x, 0xb1), 0xb1)
        };
        ($x:expr, $r:literal) => {
            _mm_or_si128(_mm_slli_epi32($x, $r), _mm_srli_epi32($x, 32 - $r))
        };
    }
    macro_rules! quarter {
        () => {
            a = _mm_add_epi32(a, b);
            d = rotl!(_mm_xor_si128(d, a), 16);
            c = _mm_add_epi32(c, d);
            b = rotl!(_mm_xor_si128(b, c), 12);
            a = _mm_add_epi32(a, b);
            d = rotl!(_mm_xor_si128(d, a), 8);
            c = _mm_add_epi32(c, d);
            b = rotl!(_mm_xor_si128(b, c), 7);
        };
    }
    for _ in 0..10 {
        quarter!();
        b = _mm_shuffle_epi32(b, 0x39);
        c = _mm_shuffle_epi32(c, 0x4e);
        d = _mm_shuffle_epi32(d, 0x93);
        quarter!();
        b = _mm_shuffle_epi32(b, 0x93);
        c = _mm_shuffle_epi32(c, 0x4e);
        d = _mm_shuffle_epi32(d, 0x39);
    }
    // the keystream's bytes are little-endian (as x86-64's memory), so the 16 state words
    // stored in order are the 8 64-bit words lo | hi << 32
    let p = out.as_mut_ptr() as *mut __m128i;
    _mm_storeu_si128(p, _mm_add_epi32(a, a0));
    _mm_storeu_si128(p.add(1), _mm_add_epi32(b, b0));
    _mm_storeu_si128(p.add(2), _mm_add_epi32(c, c0));
    _mm_storeu_si128(p.add(3), _mm_add_epi32(d, d0));
}

/// chacha20_block word by word (the state as RFC 8439 writes it; other architectures).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn chacha20_block_words(key: &[u32; 8], counter: u32, nonce: &[u32; 3], out: &mut [u64; 8]) {
    let init: [u32; 16] = [
        0x6170_7865,
        0x3320_646e,
        0x7962_2d32,
        0x6b20_6574,
        key[0],
        key[1],
        key[2],
        key[3],
        key[4],
        key[5],
        key[6],
        key[7],
        counter,
        nonce[0],
        nonce[1],
        nonce[2],
    ];
    let mut x = init;
    macro_rules! qr {
        ($a:expr, $b:expr, $c:expr, $d:expr) => {
            x[$a] = x[$a].wrapping_add(x[$b]);
            x[$d] = (x[$d] ^ x[$a]).rotate_left(16);
            x[$c] = x[$c].wrapping_add(x[$d]);
            x[$b] = (x[$b] ^ x[$c]).rotate_left(12);
            x[$a] = x[$a].wrapping_add(x[$b]);
            x[$d] = (x[$d] ^ x[$a]).rotate_left(8);
            x[$c] = x[$c].wrapping_add(x[$d]);
            x[$b] = (x[$b] ^ x[$c]).rotate_left(7);
        };
    }
    for _ in 0..10 {
        qr!(0, 4, 8, 12);
        qr!(1, 5, 9, 13);
        qr!(2, 6, 10, 14);
        qr!(3, 7, 11, 15);
        qr!(0, 5, 10, 15);
        qr!(1, 6, 11, 12);
        qr!(2, 7, 8, 13);
        qr!(3, 4, 9, 14);
    }
    for i in 0..8 {
        let lo = x[2 * i].wrapping_add(init[2 * i]) as u64;
        let hi = x[2 * i + 1].wrapping_add(init[2 * i + 1]) as u64;
        // the keystream's bytes are little-endian, so a 64-bit word is lo | hi << 32
        out[i] = lo | (hi << 32);
    }
}

/// Blocks `chacha20_blocks4` computes at once.
const WIDE: u64 = 4;

/// The WIDE blocks `counter` .. `counter + 3` (their counters wrapping at 2^32: a block
/// past the lane's end is never served), one after the other in `out`. On x86-64 the
/// four blocks' states side by side in SSE2 registers (word i of the four in one
/// register): sixteen independent vectors, where one block's rows wait on each other.
#[inline(always)]
fn chacha20_blocks4(key: &[u32; 8], counter: u64, nonce: &[u32; 3], out: &mut [u64; 32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe {
        chacha20_blocks4_sse2(key, counter as u32, nonce, out);
    }
    #[cfg(not(target_arch = "x86_64"))]
    for j in 0..WIDE as usize {
        let mut block = [0u64; 8];
        chacha20_block(
            key,
            (counter as u32).wrapping_add(j as u32),
            nonce,
            &mut block,
        );
        out[8 * j..8 * j + 8].copy_from_slice(&block);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn chacha20_blocks4_sse2(
    key: &[u32; 8],
    counter: u32,
    nonce: &[u32; 3],
    out: &mut [u64; 32],
) {
    use std::arch::x86_64::*;
    let splat = |w: u32| _mm_set1_epi32(w as i32);
    let c = counter;
    let init: [__m128i; 16] = [
        splat(0x6170_7865),
        splat(0x3320_646e),
        splat(0x7962_2d32),
        splat(0x6b20_6574),
        splat(key[0]),
        splat(key[1]),
        splat(key[2]),
        splat(key[3]),
        splat(key[4]),
        splat(key[5]),
        splat(key[6]),
        splat(key[7]),
        _mm_set_epi32(
            c.wrapping_add(3) as i32,
            c.wrapping_add(2) as i32,
            c.wrapping_add(1) as i32,
            c as i32,
        ),
        splat(nonce[0]),
        splat(nonce[1]),
        splat(nonce[2]),
    ];
    let mut x = init;
    macro_rules! rotl {
        ($x:expr, 16) => {
            _mm_shufflehi_epi16(_mm_shufflelo_epi16($x, 0xb1), 0xb1)
        };
        ($x:expr, $r:literal) => {
            _mm_or_si128(_mm_slli_epi32($x, $r), _mm_srli_epi32($x, 32 - $r))
        };
    }
    macro_rules! qr {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            x[$a] = _mm_add_epi32(x[$a], x[$b]);
            x[$d] = rotl!(_mm_xor_si128(x[$d], x[$a]), 16);
            x[$c] = _mm_add_epi32(x[$c], x[$d]);
            x[$b] = rotl!(_mm_xor_si128(x[$b], x[$c]), 12);
            x[$a] = _mm_add_epi32(x[$a], x[$b]);
            x[$d] = rotl!(_mm_xor_si128(x[$d], x[$a]), 8);
            x[$c] = _mm_add_epi32(x[$c], x[$d]);
            x[$b] = rotl!(_mm_xor_si128(x[$b], x[$c]), 7);
        };
    }
    for _ in 0..10 {
        qr!(0, 4, 8, 12);
        qr!(1, 5, 9, 13);
        qr!(2, 6, 10, 14);
        qr!(3, 7, 11, 15);
        qr!(0, 5, 10, 15);
        qr!(1, 6, 11, 12);
        qr!(2, 7, 8, 13);
        qr!(3, 4, 9, 14);
    }
    let mut words = [[0u32; 4]; 16];
    for i in 0..16 {
        _mm_storeu_si128(
            words[i].as_mut_ptr() as *mut __m128i,
            _mm_add_epi32(x[i], init[i]),
        );
    }
    for j in 0..WIDE as usize {
        for i in 0..8 {
            // the keystream's bytes are little-endian, so a 64-bit word is lo | hi << 32
            out[8 * j + i] = words[2 * i][j] as u64 | ((words[2 * i + 1][j] as u64) << 32);
        }
    }
}

/// The position is past the lane's last block: the reference raises there.
struct EndOfLane;

/// Sequential words of one lane from a position (rng.py WordCursor, without a buffer
/// that outlives the call): one block first (most calls read a few words), then WIDE
/// blocks at a time.
struct Words {
    key: [u32; 8],
    nonce: [u32; 3],
    position: u64,
    /// the position of buf[0], and how many of buf's words are read (none past the
    /// lane's last block)
    start: u64,
    len: u64,
    buf: [u64; 32],
}

impl Words {
    fn new(key: &[u8; 32], lane: u128, position: u64) -> Words {
        let mut k = [0u32; 8];
        for (i, c) in key.chunks_exact(4).enumerate() {
            k[i] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        let nonce = [lane as u32, (lane >> 32) as u32, (lane >> 64) as u32];
        Words {
            key: k,
            nonce,
            position,
            start: u64::MAX,
            len: 0,
            buf: [0; 32],
        }
    }

    fn next(&mut self) -> Result<u64, EndOfLane> {
        let mut i = self.position.wrapping_sub(self.start);
        if i >= self.len {
            let block = self.position / WORDS_PER_BLOCK;
            if block >= MAX_BLOCK {
                return Err(EndOfLane);
            }
            if self.start == u64::MAX || MAX_BLOCK - block < WIDE {
                let first: &mut [u64; 8] = (&mut self.buf[..8]).try_into().expect("8 words");
                chacha20_block(&self.key, block as u32, &self.nonce, first);
                self.len = WORDS_PER_BLOCK;
            } else {
                chacha20_blocks4(&self.key, block, &self.nonce, &mut self.buf);
                self.len = WIDE * WORDS_PER_BLOCK;
            }
            self.start = block * WORDS_PER_BLOCK;
            i = self.position - self.start;
        }
        let w = self.buf[i as usize];
        self.position += 1;
        Ok(w)
    }

    /// scalar.uniform_below(m) for 2 <= m <= 2^64: the top bitlen(m - 1) bits of a word,
    /// retried while >= m.
    fn uniform_below(&mut self, m: u128) -> Result<u64, EndOfLane> {
        let bits = 128 - (m - 1).leading_zeros();
        let shift = 64 - bits;
        loop {
            let x = self.next()? >> shift;
            if (x as u128) < m {
                return Ok(x);
            }
        }
    }

    /// scalar.bernoulli_exp_minus_one: one accepted word decides unless K > 18, then von
    /// Neumann's loop goes on exactly at k = 19 (Bernoulli(1/k) = uniform_below(k) == 0).
    fn bernoulli_exp_minus_one(&mut self) -> Result<bool, EndOfLane> {
        let mut w = self.next()?;
        while w > F18_LIMIT {
            w = self.next()?;
        }
        let r = w % F18;
        let nle = VN_THRESHOLDS.partition_point(|&th| th <= r) as u64;
        if nle > 0 {
            return Ok((19 - nle) % 2 == 1);
        }
        let mut k: u64 = 19;
        while self.uniform_below(k as u128)? == 0 {
            k += 1;
        }
        Ok(k % 2 == 1)
    }

    /// scalar._discrete_laplace(t, s) for t, s >= 1; None when the reference must make
    /// this draw (a value beyond i64, a von Neumann modulus beyond 2^64: both far beyond
    /// any probability that comes up, but exact either way).
    fn discrete_laplace(&mut self, t: u64, s: u64) -> Result<Option<i64>, EndOfLane> {
        let t128 = t as u128;
        loop {
            let u = if t > 1 { self.uniform_below(t128)? } else { 0 };
            // Bernoulli(exp(-u/t)): k = 1; while bern_frac(u, t k): k += 1; K odd passes.
            // bern_frac(0, .) is False without a word, and u < t <= t k.
            let mut k: u128 = 1;
            if u != 0 {
                loop {
                    let m = t128 * k;
                    if m > 1u128 << 64 {
                        return Ok(None);
                    }
                    if self.uniform_below(m)? >= u {
                        break;
                    }
                    k += 1;
                }
            }
            if k & 1 == 0 {
                continue;
            }
            let mut v: u128 = 0;
            while self.bernoulli_exp_minus_one()? {
                v += 1;
            }
            let y = (u as u128 + t128 * v) / s as u128;
            let negative = self.next()? >> 63 == 1;
            if negative && y == 0 {
                continue; // "minus zero": draw again
            }
            if y > i64::MAX as u128 {
                return Ok(None);
            }
            let y = y as i64;
            return Ok(Some(if negative { -y } else { y }));
        }
    }
}

impl Words {
    /// scalar._bern_exp(num, den) for num >= 0, den >= 1: floor(num/den) Bernoulli(exp(-1))
    /// trials, then von Neumann's loop on the remainder (bern_frac(rem, den k) is
    /// uniform_below(den k) < rem, no word when rem is 0); None when a modulus den k
    /// passes 2^64 (the reference reads several words there).
    fn bern_exp(&mut self, num: u64, den: u64) -> Result<Option<bool>, EndOfLane> {
        let (whole, rem) = (num / den, num % den);
        for _ in 0..whole {
            if !self.bernoulli_exp_minus_one()? {
                return Ok(Some(false));
            }
        }
        let mut k: u128 = 1;
        if rem != 0 {
            loop {
                let m = den as u128 * k;
                if m > 1u128 << 64 {
                    return Ok(None);
                }
                if self.uniform_below(m)? >= rem {
                    break;
                }
                k += 1;
            }
        }
        Ok(Some(k % 2 == 1))
    }
}

/// svt.py's _REL: the relative error bound of a float quantity in the plan sampler.
const REL: f64 = 1.0 / (1u64 << 40) as f64;

/// One SVT's constants for its plan sampler (svt.py `_scan_constants`, tau, Z_0).
struct Plan {
    tau: f64,
    b8: f64,
    c: i64,
    z0: i64,
    t1: u64,
    lam: f64,
    log1pq: f64,
    g: f64,
}

/// What `candidate` found (svt.py `_candidate_float`): no candidate, a candidate step
/// with k at its block's start, or "float bounds cannot decide" (the reference's decimal
/// path takes over).
enum Candidate {
    Never,
    At(u64, i64),
    Unsure,
}

impl Plan {
    /// svt.py `SVT._k`: floor((tau + b8 ln(s + c)) * UNIT) + Z_0 - v, the same float
    /// operations (libm's log, as Python's math.log); None beyond 62 bits.
    fn k(&self, v: i64, s: u64) -> Option<i64> {
        let x = ((self.tau + self.b8 * ((s as i64 + self.c) as f64).ln()) * 65536.0).floor();
        if x.is_nan() || x.abs() >= (1u64 << 62) as f64 {
            return None;
        }
        (x as i64).checked_add(self.z0)?.checked_sub(v)
    }

    /// svt.py `SVT._tail_bound`, operation for operation.
    fn tail_bound(&self, s: u64, p: f64, h: f64) -> f64 {
        let g1 = self.g - 1.0;
        if g1 <= 0.0 {
            return f64::INFINITY;
        }
        let tail = (2.0 / self.t1 as f64).exp() * p * (1.0 + (s as i64 + self.c) as f64 / g1);
        (s as f64 * h + 4.0 * s as f64 * p + 4.0 * tail) * (1.0 + 1.0 / (1u64 << 30) as f64)
            + 1e-300
    }

    /// svt.py `SVT._candidate_float` for U in [m / 2^64, (m + 1) / 2^64) (a fresh
    /// `_Uniform`: 64 bits), operation for operation; None where a value passes 62 bits.
    fn candidate(&self, v: i64, s: u64, end: u64, m: u64) -> Option<Candidate> {
        let (e_lo, e_hi) = e_bounds(m);
        let mut b = s;
        let mut c_mid = 0.0f64;
        let mut c_err = 1e-300f64;
        while b < end {
            let kb = self.k(v, b)?;
            let lp = (-(kb as i128 + 1)) as f64 * self.lam - self.log1pq;
            let p = lp.exp();
            let h = -(-p).ln_1p();
            if e_lo - c_mid - c_err >= self.tail_bound(b, p, h) {
                return Some(Candidate::Never);
            }
            let rel = (lp.abs() + 4.0) * REL;
            let e = (1u64 << (64 - b.leading_zeros())).min(end);
            let term = (e - b) as f64 * h;
            let n_mid = c_mid + term;
            let n_err = c_err + term * (rel + REL) + n_mid * REL;
            if e_hi < n_mid - n_err {
                let y_lo = (e_lo - c_mid - c_err) / (h * (1.0 + rel)) * (1.0 - REL);
                let y_hi = (e_hi - c_mid + c_err) / (h * (1.0 - rel)) * (1.0 + REL);
                if !y_lo.is_finite() || !y_hi.is_finite() {
                    return Some(Candidate::Unsure);
                }
                let g = y_lo.floor().max(0.0);
                // g != floor(y_hi) or g >= e - b (exactly: g is a whole float, e - b < 2^62)
                if g != y_hi.floor() || g >= (1u64 << 62) as f64 || g as u64 >= e - b {
                    return Some(Candidate::Unsure);
                }
                return Some(Candidate::At(b + g as u64, kb));
            }
            if e_lo < n_mid + n_err {
                return Some(Candidate::Unsure);
            }
            c_mid = n_mid;
            c_err = n_err;
            b = e;
        }
        Some(Candidate::Never)
    }
}

/// svt.py `_neg_log(num, 2^64)`: -ln(num / 2^64) for 1 <= num <= 2^64 (num / 2^64 is
/// correctly rounded in Python; num rounded to a float and scaled by 2^-64 is the same).
fn neg_log(num: u128) -> f64 {
    let full: u128 = 1 << 64;
    let scale = 1.0 / (1u128 << 64) as f64;
    if 2 * num > full {
        -(-(((full - num) as f64) * scale)).ln_1p()
    } else {
        -((num as f64) * scale).ln()
    }
}

/// svt.py `_Uniform.e_bounds_float` at 64 bits: float bounds (lo, hi) on E = -ln U.
fn e_bounds(m: u64) -> (f64, f64) {
    let lo = neg_log(m as u128 + 1) * (1.0 - REL);
    let hi = if m == 0 {
        f64::INFINITY
    } else {
        neg_log(m as u128) * (1.0 + REL)
    };
    (lo, hi)
}

/// svt.py `SVT._sample(v, start, end, pos)` on the skip lane's words from `src`'s
/// position: (first firing step or None, position after); None where the reference must
/// run it (float bounds cannot decide, a draw this crate leaves, a value past 62 bits).
fn svt_sample(
    src: &mut Words,
    p: &Plan,
    v: i64,
    start: u64,
    end: u64,
) -> Result<Option<Option<u64>>, EndOfLane> {
    let mut s = start;
    while s < end {
        let Some(k) = p.k(v, s) else { return Ok(None) };
        if k < 0 {
            let Some(z) = src.discrete_laplace(p.t1, 1)? else {
                return Ok(None);
            };
            if z > k {
                return Ok(Some(Some(s)));
            }
            s += 1;
            continue;
        }
        let m = src.next()?;
        let (c, kb) = match p.candidate(v, s, end, m) {
            Some(Candidate::Never) => return Ok(Some(None)),
            Some(Candidate::At(c, kb)) => (c, kb),
            Some(Candidate::Unsure) | None => return Ok(None),
        };
        let Some(kc) = p.k(v, c) else { return Ok(None) };
        if kc < kb {
            return Ok(None);
        }
        match src.bern_exp((kc - kb) as u64, p.t1)? {
            Some(true) => return Ok(Some(Some(c))),
            Some(false) => s = c + 1,
            None => return Ok(None),
        }
    }
    Ok(Some(None))
}

/// block._limit(m): the largest word accepted for a uniform w mod m from one word.
fn accept_limit(m: u64) -> u64 {
    u64::MAX - ((1u128 << 64) % m as u128) as u64
}

/// An attempt left unfinished by the bounded loops of `block_attempts` (block.py
/// `_run_attempts`'s parked tuple): offset, stage, U, negative, k, v.
type Parked = (i64, i64, u64, bool, i64, i64);
/// What `block_attempts` returns: offsets and samples of the attempts that produced one,
/// and the parked attempts.
type Attempts = (Vec<i64>, Vec<i64>, Vec<Parked>);

/// Stage of a parked attempt (block.py _PARKED_IN_VN, _PARKED_IN_GEOMETRIC).
const PARKED_IN_VN: i64 = 1;
const PARKED_IN_GEOMETRIC: i64 = 2;
/// block.py _VN_COLUMNS, _VN_COLUMNS_LATER, _GEOMETRIC_COLUMNS, _GEOMETRIC_COLUMNS_LATER,
/// _MAX_SUB.
const VN_COLUMNS: usize = 2;
const VN_COLUMNS_LATER: usize = 4;
const GEOMETRIC_COLUMNS: usize = 3;
const GEOMETRIC_COLUMNS_LATER: usize = 5;
const MAX_SUB: usize = 8;

/// block.py `_run_attempts(src, a, t, s, ...)` on the words of `src` from its position:
/// the same words in the same layout (column by column within a sub-pass), the same
/// decisions, the same words consumed. Returns the offsets and samples of the attempts
/// that produced one, in attempt order, and the parked attempts (in the reference's
/// order). Requires 1 <= t <= 2^48 (block.BLOCK_MAX_T) and s >= 1.
fn block_attempts(src: &mut Words, a: usize, t: u64, s: u64) -> Result<Attempts, EndOfLane> {
    let mut parked: Vec<Parked> = Vec::new();
    let two_t = 2 * t;
    let lim0 = accept_limit(two_t);
    let mut uu = vec![0u64; a];
    let mut neg = vec![false; a];
    let mut d_ids: Vec<usize> = Vec::with_capacity(a);
    for i in 0..a {
        let w = src.next()?;
        let r = w % two_t;
        uu[i] = r >> 1;
        neg[i] = r & 1 == 1;
        if w <= lim0 {
            d_ids.push(i);
        }
    }
    // Bernoulli(exp(-U/t)): von Neumann step k is Bernoulli(U / (t k)); the modulus t k
    // and its acceptance limit by k (block._block_tables), k below 2 + 4 x 9.
    let m_tab: Vec<u64> = (0..2 + VN_COLUMNS_LATER as u64 * (MAX_SUB as u64 + 1))
        .map(|k| t * k.max(1))
        .collect();
    let lim_tab: Vec<u64> = m_tab.iter().map(|&m| accept_limit(m)).collect();
    let mut d_k: Vec<u64> = vec![1; d_ids.len()];
    let mut passed: Vec<usize> = Vec::new();
    let mut words: Vec<u64> = Vec::new();
    for sub in 0..MAX_SUB {
        let nd = d_ids.len();
        if nd == 0 {
            break;
        }
        let ncol = if sub == 0 {
            VN_COLUMNS
        } else {
            VN_COLUMNS_LATER
        };
        words.clear();
        for _ in 0..nd * ncol {
            words.push(src.next()?);
        }
        let mut next_ids = Vec::new();
        let mut next_k = Vec::new();
        for i in 0..nd {
            let u = uu[d_ids[i]];
            let mut run = true;
            let mut stuck = false;
            let mut f: u64 = 0;
            for c in 0..ncol {
                let w = words[c * nd + i];
                let k = (d_k[i] + c as u64) as usize;
                let m = m_tab[k];
                let acc = w <= lim_tab[k];
                let mut ok = w % m < u;
                if !acc {
                    stuck |= run;
                    ok = false;
                }
                run &= ok;
                f += run as u64;
            }
            let k_stop = d_k[i] + f;
            if !(run || stuck) {
                if k_stop & 1 == 1 {
                    passed.push(d_ids[i]);
                }
            } else {
                next_ids.push(d_ids[i]);
                next_k.push(k_stop);
            }
        }
        d_ids = next_ids;
        d_k = next_k;
    }
    for (j, k) in d_ids.iter().zip(d_k.iter()) {
        parked.push((*j as i64, PARKED_IN_VN, uu[*j], neg[*j], *k as i64, 0));
    }
    // V: Bernoulli(exp(-1)) successes before the first failure, one word per trial.
    let mut v_ids = passed;
    let mut v_v: Vec<u64> = vec![0; v_ids.len()];
    let mut done: Vec<(usize, u64)> = Vec::new();
    for sub in 0..MAX_SUB {
        let nv = v_ids.len();
        if nv == 0 {
            break;
        }
        let ncol = if sub == 0 {
            GEOMETRIC_COLUMNS
        } else {
            GEOMETRIC_COLUMNS_LATER
        };
        words.clear();
        for _ in 0..nv * ncol {
            words.push(src.next()?);
        }
        let mut next_ids = Vec::new();
        let mut next_v = Vec::new();
        for i in 0..nv {
            let mut run = true;
            let mut stuck = false;
            let mut deep = false;
            let mut f: u64 = 0;
            for c in 0..ncol {
                let w = words[c * nv + i];
                // thresholds <= r; K = 19 - nle; K odd (nle even) is a success
                let nle = VN_THRESHOLDS.partition_point(|&th| th <= w % F18);
                let mut ok = nle % 2 == 0;
                let dec = w <= F18_LIMIT && nle > 0;
                if !dec {
                    if run {
                        stuck = true;
                        deep |= w <= F18_LIMIT;
                    }
                    ok = false;
                }
                run &= ok;
                f += run as u64;
            }
            let vf = v_v[i] + f;
            let j = v_ids[i];
            if !(run || stuck) {
                done.push((j, vf));
            }
            if deep {
                parked.push((j as i64, PARKED_IN_GEOMETRIC, uu[j], neg[j], 19, vf as i64));
            }
            if run || (stuck && !deep) {
                next_ids.push(j);
                next_v.push(vf);
            }
        }
        v_ids = next_ids;
        v_v = next_v;
    }
    for (j, v) in v_ids.iter().zip(v_v.iter()) {
        parked.push((
            *j as i64,
            PARKED_IN_GEOMETRIC,
            uu[*j],
            neg[*j],
            0,
            *v as i64,
        ));
    }
    done.sort_by_key(|&(j, _)| j);
    let mut ids = Vec::with_capacity(done.len());
    let mut vals = Vec::with_capacity(done.len());
    for (j, v) in done {
        let y = (uu[j] + t * v) / s;
        if neg[j] && y == 0 {
            continue; // "minus zero" rejects the attempt
        }
        ids.push(j as i64);
        vals.push(if neg[j] { -(y as i64) } else { y as i64 });
    }
    Ok((ids, vals, parked))
}

/// Draws or attempts (each about 0.1-0.2 us) from which a call runs without the GIL:
/// about 30 us of work. A shorter call keeps it. Giving the GIL up and taking it back
/// costs more than such a call when another thread runs Python meanwhile (the worker's
/// event loop and consumer thread beside a marker's or a stop's thread): a restored
/// counter's advance over its dense prefix, 8 draws, took 26-28 us instead of 19-20
/// beside a thread running Python in short bursts (`bench_samplers.py --beside-python`).
const WITHOUT_GIL_FROM: usize = 256;

/// `f()`, without the GIL where `units` of work are at least WITHOUT_GIL_FROM.
fn run_sized<T: Send>(py: Python<'_>, units: usize, f: impl FnOnce() -> T + Send) -> T {
    if units >= WITHOUT_GIL_FROM {
        py.allow_threads(f)
    } else {
        f()
    }
}

fn key_of(key: &[u8]) -> PyResult<[u8; 32]> {
    // The message names the length only, never the bytes.
    key.try_into()
        .map_err(|_| pyo3::exceptions::PyValueError::new_err("a derived stream key has 32 bytes"))
}

/// n draws scalar._discrete_laplace(t, s) from word `position` of `lane`, as a flat list
/// value, position after, value, position after, ... ; fewer than n when a draw is left
/// to the reference (it starts at the last position in the list, or at `position`).
#[pyfunction]
#[pyo3(signature = (key, lane, position, t, s, n))]
fn discrete_laplace_run(
    py: Python<'_>,
    key: &[u8],
    lane: u128,
    position: u64,
    t: u64,
    s: u64,
    n: usize,
) -> PyResult<Vec<i64>> {
    let key = key_of(key)?;
    if t < 1 || s < 1 || lane >= 1u128 << 96 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "t, s >= 1 and lane < 2^96",
        ));
    }
    Ok(run_sized(py, n, || {
        let mut src = Words::new(&key, lane, position);
        let mut out = Vec::with_capacity(2 * n);
        for _ in 0..n {
            match src.discrete_laplace(t, s) {
                Ok(Some(y)) => {
                    out.push(y);
                    out.push(src.position as i64);
                }
                _ => break,
            }
        }
        out
    }))
}

/// block.py `_run_attempts` on the words of `lane` from word `position` (see
/// `block_attempts`): (offsets, samples, parked attempts, position after), or None when
/// the words run past the lane's end (the reference then runs it).
#[pyfunction]
#[pyo3(signature = (key, lane, position, a, t, s))]
#[allow(clippy::type_complexity)]
fn discrete_laplace_attempts(
    py: Python<'_>,
    key: &[u8],
    lane: u128,
    position: u64,
    a: usize,
    t: u64,
    s: u64,
) -> PyResult<Option<(Vec<i64>, Vec<i64>, Vec<Parked>, u64)>> {
    let key = key_of(key)?;
    if !(1..=1 << 48).contains(&t) || s < 1 || lane >= 1u128 << 96 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "1 <= t <= 2^48, s >= 1 and lane < 2^96",
        ));
    }
    Ok(run_sized(py, a, || {
        let mut src = Words::new(&key, lane, position);
        match block_attempts(&mut src, a, t, s) {
            Ok((ids, vals, parked)) => Some((ids, vals, parked, src.position)),
            Err(EndOfLane) => None,
        }
    }))
}

/// svt.py `SVT._sample(v, start, end, pos)` on lane 0 of the skip stream's `key`, with
/// the instance's constants (`_scan_constants`, tau, Z_0): (firing step or None, position
/// after), the same words read and the same decisions as the reference; None where the
/// reference must run it (its decimal path, a rare draw, a lane's end, 62-bit ranges).
#[pyfunction]
#[pyo3(signature = (key, pos, v, start, end, tau, b8, c, z0, t1, lam, log1pq, g))]
#[allow(clippy::too_many_arguments)]
fn svt_plan(
    key: &[u8],
    pos: u64,
    v: i64,
    start: u64,
    end: u64,
    tau: f64,
    b8: f64,
    c: i64,
    z0: i64,
    t1: u64,
    lam: f64,
    log1pq: f64,
    g: f64,
) -> PyResult<Option<(Option<u64>, u64)>> {
    let key = key_of(key)?;
    let limit = 1u64 << 62;
    if t1 < 1 || start < 1 || end > limit || !(0..1 << 62).contains(&c) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "t1 >= 1, 1 <= start, end <= 2^62, 0 <= c < 2^62",
        ));
    }
    let plan = Plan {
        tau,
        b8,
        c,
        z0,
        t1,
        lam,
        log1pq,
        g,
    };
    let mut src = Words::new(&key, 0, pos);
    Ok(match svt_sample(&mut src, &plan, v, start, end) {
        Ok(Some(step)) => Some((step, src.position)),
        _ => None,
    })
}

/// n keystream words of `lane` from word `start`, little-endian bytes (rng.py
/// KeyedStream.word_array's bytes): the tests compare it with the reference cipher.
/// Block by block into the output (one bounds check per call, not one per word).
#[pyfunction]
fn keystream<'py>(
    py: Python<'py>,
    key: &[u8],
    lane: u128,
    start: u64,
    n: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let key = key_of(key)?;
    if lane >= 1u128 << 96 {
        return Err(pyo3::exceptions::PyValueError::new_err("lane < 2^96"));
    }
    let first = start / WORDS_PER_BLOCK;
    let end = start.checked_add(n).map(|e| e.div_ceil(WORDS_PER_BLOCK));
    if end.is_none_or(|e| e > MAX_BLOCK) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "stream position beyond 2^32 blocks",
        ));
    }
    let src = Words::new(&key, lane, start);
    let (k, nonce) = (src.key, src.nonce);
    let len = 8 * n as usize;
    let fill = |out: &mut [u8]| {
        let mut buf = [0u64; 32];
        let mut at = 0usize;
        let mut skip = (start % WORDS_PER_BLOCK) as usize;
        let mut block = first;
        while at < len {
            // WIDE blocks at once where at least that many are read (and exist)
            let wide = len - at + 8 * skip >= 64 * WIDE as usize && MAX_BLOCK - block >= WIDE;
            let got = if wide {
                chacha20_blocks4(&k, block, &nonce, &mut buf);
                WIDE
            } else {
                let one: &mut [u64; 8] = (&mut buf[..8]).try_into().expect("8 words");
                chacha20_block(&k, block as u32, &nonce, one);
                1
            };
            for w in &buf[skip..(8 * got) as usize] {
                if at >= len {
                    break;
                }
                out[at..at + 8].copy_from_slice(&w.to_le_bytes());
                at += 8;
            }
            skip = 0;
            block += got;
        }
    };
    if len >= 1 << 16 {
        // a long read (a bank chunk) without the GIL
        let mut v = vec![0u8; len];
        py.allow_threads(|| fill(&mut v));
        return Ok(PyBytes::new(py, &v));
    }
    PyBytes::new_with(py, len, |out| {
        fill(out);
        Ok(())
    })
}

#[pymodule]
fn dpc_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(discrete_laplace_run, m)?)?;
    m.add_function(wrap_pyfunction!(keystream, m)?)?;
    m.add_function(wrap_pyfunction!(discrete_laplace_attempts, m)?)?;
    m.add_function(wrap_pyfunction!(svt_plan, m)?)?;
    Ok(())
}
