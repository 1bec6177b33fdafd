"""The keyed cryptographic generator: the only source of noise in the project.

A secret noise key and a label (the counter's identity plus the component inside the
mechanism) give a ChaCha20 key by HMAC-SHA256. Each key has 2^96 independent "lanes" (the
ChaCha20 nonce), each an addressable stream of 64-bit words. A mechanism keeps the word
position it has consumed in its state, so re-executing after a crash reproduces exactly
the same draws: noise is never redrawn.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import sys
from array import array
from typing import Final

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher
from cryptography.hazmat.primitives.ciphers.algorithms import ChaCha20

from processor.core.errors import NoiseKeyError
from processor.core.samplers.native import NATIVE

MIN_KEY_BYTES = 32

#: Key file formats, the one rule every key reader applies (`NoiseKey.from_bytes`):
#: "hex" (the default, what `keygen` writes): exactly 2 * MIN_KEY_BYTES hex digits, then at
#: most one "\n", nothing else (no spaces, no comment); "raw": exactly MIN_KEY_BYTES bytes.
#: Both sizes are exact, so a hex file read as "raw" (or the reverse) is refused too.
KEY_FORMATS = ("hex", "raw")
_HEX_KEY = re.compile(rb"[0-9A-Fa-f]{%d}\n?" % (2 * MIN_KEY_BYTES))
_KEY_RULES = {
    "hex": f"expected exactly {2 * MIN_KEY_BYTES} hex digits and at most one trailing "
           "newline, nothing else (raw key bytes need the key format \"raw\")",
    "raw": f"expected exactly {MIN_KEY_BYTES} bytes (a hex key file needs the key format "
           "\"hex\")",
}
#: What every derived key's HMAC message starts with (then the label, UTF-8).
_LABEL_PREFIX: Final = b"dp-stream-counts/v1/"
_WORDS_PER_BLOCK = 8  # a ChaCha20 block is 64 bytes
#: The key stream's words are little-endian; array('Q') holds native ones.
_BIG_ENDIAN: Final = sys.byteorder == "big"
_MAX_BLOCK = 1 << 32


class NoiseKey:
    """A secret noise key. Its bytes never appear in repr, str, logs or errors."""

    __slots__ = ("_derived", "_mac", "_secret", "reproducible")

    #: Derived keys kept per NoiseKey: restoring a counter derives one key per component,
    #: the same labels again and again. Bounded (emptied when full); the derived keys are
    #: as secret as the ChaCha20 keys every live counter already holds in memory. Small:
    #: a stream keeps its own key once derived, so this serves only counters decoded
    #: again soon, and 65,536 labels with their keys would take about 14 MB.
    _DERIVED_MAX = 1 << 12

    def __init__(self, secret: bytes, *, reproducible: bool = False) -> None:
        if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_KEY_BYTES:
            raise NoiseKeyError(f"a noise key needs at least {MIN_KEY_BYTES} bytes of secret")
        self._secret = bytes(secret)
        self.reproducible = reproducible
        self._derived: dict[str, bytes] = {}
        #: HMAC-SHA256 keyed with the secret, the label prefix fed: `derive` copies it
        #: and feeds the label (HMAC(secret, prefix + label), without keying HMAC again)
        self._mac = hmac.new(self._secret, _LABEL_PREFIX, "sha256")

    @classmethod
    def from_bytes(cls, data: bytes, key_format: str = "hex",
                   what: str = "noise key") -> NoiseKey:
        """A key from the content of a key file in `key_format` (KEY_FORMATS; "hex" is
        what `keygen` writes). Reading the file is processor.keyfile's job: the core does
        no I/O.

        The format is stated, never guessed from the content: a hex file with a typo must
        not become a different key read as raw bytes. Errors name `what` and the rule,
        never the content.
        """
        return cls(_decode_key(data, key_format, what))

    @classmethod
    def from_hex(cls, text: str) -> NoiseKey:
        """A key from hex text under the hex file rule (64 hex digits, optional newline)."""
        try:
            data = text.encode("ascii")
        except UnicodeEncodeError:
            data = b"\xff"  # not hex: let the one rule reject it
        return cls(_decode_key(data, "hex", "noise key"))

    @classmethod
    def from_seed(cls, seed: int) -> NoiseKey:
        """A public, reproducible key for tests and experiments. Not for production releases."""
        return cls(seed_secret(seed), reproducible=True)

    @staticmethod
    def generate() -> bytes:
        return os.urandom(MIN_KEY_BYTES)

    def derive(self, label: str) -> bytes:
        out = self._derived.get(label)
        if out is None:
            # HMAC(secret, _LABEL_PREFIX + label): the keyed state with the prefix fed is
            # copied (tests/core/test_rng.py checks it against the one-shot hmac.digest)
            mac = self._mac.copy()
            mac.update(label.encode())
            out = mac.digest()
            if len(self._derived) >= self._DERIVED_MAX:
                self._derived.clear()
            self._derived[label] = out
        return out

    def fingerprint(self) -> str:
        """A public, non-invertible identifier of the key (for ledgers): not the key."""
        return hmac.new(self._secret, b"fingerprint", hashlib.sha256).hexdigest()[:16]

    def __repr__(self) -> str:
        return "NoiseKey(<secret>)"

    __str__ = __repr__


def seed_secret(seed: int) -> bytes:
    """The secret of `NoiseKey.from_seed(seed)`, public: for a test or an experiment that
    writes that key to a key file (a deployment of its own keyed as the seed's)."""
    return hashlib.sha256(b"dp-stream-counts/seed/" + str(int(seed)).encode()).digest()


def _decode_key(data: bytes, key_format: str, what: str) -> bytes:
    """The secret in `data` under `key_format`; NoiseKeyError naming `what` and the rule."""
    if key_format == "hex":
        if _HEX_KEY.fullmatch(data) is None:
            raise NoiseKeyError(f"{what} is not a hex key: {_KEY_RULES['hex']}")
        return bytes.fromhex(data.rstrip(b"\n").decode("ascii"))
    if key_format == "raw":
        if len(data) != MIN_KEY_BYTES:
            raise NoiseKeyError(f"{what} is not a raw key: {_KEY_RULES['raw']}")
        return data
    raise NoiseKeyError(f"unknown noise key format {key_format!r} "
                        f"(one of {', '.join(KEY_FORMATS)})")


class KeyedStream:
    """ChaCha20 words for one label: `words(lane, start, n)` is a pure function of its arguments.

    The label's key is derived at the first draw: a restored counter that only skips
    (a heartbeat) draws nothing and pays for no derivation."""

    __slots__ = ("_key", "_noise_key", "_prefix", "_suffix")

    def __init__(self, key: NoiseKey, label: str, suffix: str = "") -> None:
        """The stream of `label` + `suffix`. The two are kept apart, and joined only at the
        first draw: a caller that holds `label` anyway (a mechanism's own label) shares it
        instead of each of its streams holding a copy with the suffix."""
        self._noise_key = key
        self._key: bytes | None = None
        self._prefix = label
        self._suffix = suffix

    @property
    def label(self) -> str:
        return self._prefix + self._suffix

    def derived_key(self) -> bytes:
        """The label's ChaCha20 key, for the native sampler's call alone (samplers/native.py):
        as secret as the noise key, never logged, stored or returned to a caller outside
        the samplers."""
        if self._key is None:
            self._key = self._noise_key.derive(self.label)
        return self._key

    def words(self, lane: int, start: int, n: int) -> np.ndarray:
        """n uint64 words of lane `lane` from word index `start`."""
        if n <= 0:
            return np.empty(0, dtype=np.uint64)
        return np.frombuffer(self.word_array(lane, start, n), dtype=np.uint64)

    def word_array(self, lane: int, start: int, n: int) -> array[int]:
        """words(lane, start, n) as an array('Q') (n >= 0), the one read every other goes
        through: the scalar readers index it directly (a numpy round trip per refill cost
        about as much as the cipher)."""
        if self._key is None:
            self._key = self._noise_key.derive(self.label)
        if lane < 0 or lane >= 1 << 96 or start < 0:
            raise ValueError("lane or position out of range")
        block, offset = divmod(start, _WORDS_PER_BLOCK)
        nblocks = -(-(offset + n) // _WORDS_PER_BLOCK)
        if block + nblocks > _MAX_BLOCK:
            raise ValueError("stream position beyond 2^32 blocks in one lane")
        if NATIVE is not None:
            # the same ChaCha20 words (tests/core/test_native_samplers.py), without setting
            # up a cipher context per read (most reads are a block or two)
            out = array("Q", NATIVE.keystream(self._key, lane, start, n))
        else:
            nonce = block.to_bytes(4, "little") + lane.to_bytes(12, "little")
            raw = Cipher(ChaCha20(self._key, nonce), mode=None).encryptor().update(
                bytes(64 * nblocks))
            out = array("Q", raw[8 * offset : 8 * (offset + n)])
        if _BIG_ENDIAN:
            out.byteswap()
        return out


#: The buffer of every cursor that has read nothing (never written to: a read replaces it).
_NO_WORDS: Final = array("Q")
if _NO_WORDS.itemsize != 8:
    raise ImportError("array('Q') must hold 64-bit words")


class WordCursor:
    """Sequential reader of one lane; `position` (words consumed) is what state stores."""

    __slots__ = ("_buf", "_buf_start", "_chunk", "lane", "position", "stream")

    #: Words fetched at a time: one ChaCha20 block at first, doubling with each refill up
    #: to _CHUNK. A counter that draws rarely (most of 100,000 idle ones) then holds 64
    #: bytes of words, not 2 KB; the words are the same whatever the chunks (a pure
    #: function of the position).
    _FIRST = 8
    _CHUNK = 256

    def __init__(self, stream: KeyedStream, lane: int = 0, position: int = 0) -> None:
        self.stream = stream
        self.lane = lane
        self.position = position
        # A shared empty buffer until the first read: most cursors of an idle counter are
        # never read.
        self._buf = _NO_WORDS
        self._buf_start = 0
        self._chunk = self._FIRST

    def _ensure(self, n: int) -> None:
        end = self._buf_start + len(self._buf)
        if self.position >= self._buf_start and self.position + n <= end:
            return
        size = max(n, self._chunk)
        self._chunk = min(2 * self._chunk, self._CHUNK)
        # 8 bytes a word (a list of Python ints takes 40 and a numpy copy 8 more): the
        # scalar samplers read one word at a time, and indexing the array costs about what
        # converting the chunk to a list did.
        self._buf = self.stream.word_array(self.lane, self.position, size)
        self._buf_start = self.position

    def window(self, n: int) -> tuple[array[int], int]:
        """(buffer, index): the buffer holds at least n words from `position` on, the
        first at `index`, for a sampler that reads them in place and then moves
        `position` by the words it used (the buffer is the cursor's own: read only)."""
        self._ensure(n)
        return self._buf, self.position - self._buf_start

    def next_word(self) -> int:
        i = self.position - self._buf_start
        if not 0 <= i < len(self._buf):
            self._ensure(1)
            i = 0
        self.position += 1
        return self._buf[i]

    def next_words(self, n: int) -> np.ndarray:
        self._ensure(n)
        i = self.position - self._buf_start
        out = np.frombuffer(self._buf[i : i + n], dtype=np.uint64)
        self.position += n
        return out

    def next_bits(self, k: int) -> int:
        """k uniform bits as a Python int (whole words are consumed)."""
        out = 0
        got = 0
        while got < k:
            out = (out << 64) | self.next_word()
            got += 64
        return out >> (got - k)
