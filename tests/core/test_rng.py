"""The keyed generator: addressing, independence of labels, key handling.

The one statistical test (uniformity of words) uses a fixed key and states its
false-alarm rate; its control shows a biased word source is rejected.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from processor.core.errors import NoiseKeyError
from processor.core.rng import KEY_FORMATS, MIN_KEY_BYTES, KeyedStream, NoiseKey, WordCursor
from processor.keyfile import read_key, write_key

ALPHA = 1e-3


def _stream(seed: int = 1, label: str = "c1/ecc/part") -> KeyedStream:
    return KeyedStream(NoiseKey.from_seed(seed), label)


def test_random_access_equals_sequential() -> None:
    st = _stream()
    whole = st.words(5, 0, 1000)
    assert whole.dtype == np.uint64 and len(whole) == 1000
    # any split, including starts in the middle of a 64-byte ChaCha20 block
    for cut in (1, 7, 8, 9, 333, 999):
        left = st.words(5, 0, cut)
        right = st.words(5, cut, 1000 - cut)
        assert np.array_equal(np.concatenate([left, right]), whole)
    assert np.array_equal(st.words(5, 517, 13), whole[517:530])


def test_cursor_reads_the_lane_in_order_and_resumes() -> None:
    st = _stream()
    whole = st.words(2, 0, 700)
    cur = WordCursor(st, 2)
    got = [cur.next_word() for _ in range(300)]
    got += cur.next_words(300).tolist()  # crosses the cursor's internal buffer
    assert got == whole[:600].tolist()
    assert cur.position == 600
    # a cursor restored at a stored position continues with exactly the same words
    again = WordCursor(st, 2, position=600)
    assert [again.next_word() for _ in range(100)] == whole[600:700].tolist()


def test_next_bits_uses_whole_words() -> None:
    st = _stream()
    w = st.words(0, 0, 3).tolist()
    cur = WordCursor(st, 0)
    assert cur.next_bits(3) == w[0] >> 61
    assert cur.position == 1
    assert cur.next_bits(65) == ((w[1] << 64) | w[2]) >> 63
    assert cur.position == 3


def test_labels_keys_and_lanes_are_independent() -> None:
    """Different labels, keys or lanes give unrelated words: no equal words, and the XOR
    of two streams has balanced bits (binomial test, false-alarm rate ALPHA)."""
    a = _stream(1, "c1/ecc/part").words(0, 0, 2000)
    others = [
        _stream(1, "c1/ecc/cc").words(0, 0, 2000),
        _stream(2, "c1/ecc/part").words(0, 0, 2000),
        _stream(1, "c1/ecc/part").words(1, 0, 2000),
    ]
    for b in others:
        assert not np.any(a == b)
        x = a ^ b
        ones = int(sum(bin(int(v)).count("1") for v in x))
        assert binomtest(ones, 64 * len(x), 0.5).pvalue > ALPHA
    # control: a stream XORed with part of itself (its top half) is not balanced
    related = a ^ (a & np.uint64(0xFFFFFFFF00000000))
    ones = int(sum(bin(int(v)).count("1") for v in related))
    assert binomtest(ones, 64 * len(related), 0.5).pvalue < ALPHA


def test_words_are_uniform() -> None:
    """Top 4 bits of 16000 words: chi-square over 16 cells, false-alarm rate ALPHA.
    Control: a source with one bit stuck at 0 fails the same test."""
    w = _stream(3).words(0, 0, 16000)
    top = (w >> np.uint64(60)).astype(np.int64)
    assert chisquare(np.bincount(top, minlength=16)).pvalue > ALPHA
    stuck = top & 0b0111
    assert chisquare(np.bincount(stuck, minlength=16)).pvalue < ALPHA


def test_key_never_in_repr_or_errors() -> None:
    secret = bytes(range(32))
    key = NoiseKey(secret)
    for text in (repr(key), str(key), f"{key}", repr(KeyedStream(key, "x"))):
        assert secret.hex() not in text
        assert key.derive("x").hex() not in text
    assert key.fingerprint() != secret.hex()[:16]
    with pytest.raises(NoiseKeyError) as info:
        NoiseKey(secret[:31])
    assert secret[:31].hex() not in str(info.value)


def _words(key: NoiseKey) -> list[int]:
    out: list[int] = KeyedStream(key, "l").words(0, 0, 4).tolist()
    return out


def test_from_file_hex_and_raw(tmp_path: Path) -> None:
    secret = NoiseKey.generate()
    assert len(secret) == MIN_KEY_BYTES
    hex_file = tmp_path / "key.hex"
    hex_file.write_text(secret.hex() + "\n")
    bare_hex = tmp_path / "key.nonl"
    bare_hex.write_text(secret.hex().upper())  # no newline, upper case: still 64 hex digits
    raw_file = tmp_path / "key.bin"
    raw_file.write_bytes(secret)
    keys = [read_key(hex_file), read_key(bare_hex, "hex"),
            read_key(raw_file, "raw"), NoiseKey.from_hex(secret.hex()),
            NoiseKey(secret)]
    assert all(_words(k) == _words(keys[-1]) for k in keys)
    assert read_key(hex_file).fingerprint() == NoiseKey(secret).fingerprint()


def test_keygen_output_reads_back_and_is_0600(tmp_path: Path) -> None:
    """The one key writer and the strict reader agree, and the file is 0600 even under a
    permissive umask and over an existing world-readable file."""
    old = os.umask(0)
    try:
        fresh = write_key(tmp_path / "fresh.key", overwrite=False)
        existing = tmp_path / "existing.key"
        existing.write_text("x")
        existing.chmod(0o644)
        write_key(existing)
    finally:
        os.umask(old)
    for path in (fresh, existing):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(read_key(path).fingerprint()) == 16


def _bad_hex_files(secret: bytes) -> dict[str, bytes]:
    h = secret.hex().encode()
    return {
        "typo": h[:10] + b"g" + h[11:] + b"\n",
        "63 digits": h[:63] + b"\n",
        "65 digits": h + b"a\n",
        "trailing comment": h + b" # production key\n",
        "comment line": h + b"\n# production key\n",
        "two newlines": h + b"\n\n",
        "crlf": h + b"\r\n",
        "leading space": b" " + h + b"\n",
        "spaced bytes": b" ".join(h[i:i + 2] for i in range(0, 64, 2)) + b"\n",
        "raw bytes": secret,
        "empty": b"",
    }


def test_bad_hex_key_files_are_refused_naming_file_and_rule(tmp_path: Path) -> None:
    """Each near-miss of the hex rule is a NoiseKeyError naming the file and the rule,
    never the content, and never silently read as raw bytes (the old reader took a
    64-byte '63 digits + newline' or a commented file as a raw key: a different key)."""
    secret = bytes(range(100, 132))
    for label, data in _bad_hex_files(secret).items():
        path = tmp_path / f"{label.replace(' ', '_')}.key"
        path.write_bytes(data)
        with pytest.raises(NoiseKeyError) as info:
            read_key(path)
        msg = str(info.value)
        assert str(path) in msg and "64 hex digits" in msg, label
        assert secret.hex()[:16] not in msg.lower() and "production" not in msg, label
    # control: the same bytes with the typo and the comment fixed are a valid key file
    good = tmp_path / "good.key"
    good.write_bytes(secret.hex().encode() + b"\n")
    assert read_key(good).fingerprint() == NoiseKey(secret).fingerprint()


def test_raw_format_is_exact_and_explicit(tmp_path: Path) -> None:
    secret = bytes(range(32))
    hex_file = tmp_path / "key.hex"
    hex_file.write_text(secret.hex() + "\n")
    # a hex file read as raw is refused (65 bytes), not taken as a 65-byte key
    with pytest.raises(NoiseKeyError, match="exactly 32 bytes"):
        read_key(hex_file, "raw")
    for n in (31, 33, 64):
        path = tmp_path / f"raw{n}"
        path.write_bytes(bytes(n))
        with pytest.raises(NoiseKeyError, match=str(path)):
            read_key(path, "raw")
    with pytest.raises(NoiseKeyError, match="unknown noise key format"):
        read_key(hex_file, "guess")
    assert KEY_FORMATS == ("hex", "raw")


def test_short_missing_or_bad_keys(tmp_path: Path) -> None:
    short = tmp_path / "short.hex"
    short.write_text("ab" * 31)
    with pytest.raises(NoiseKeyError):
        read_key(short)
    with pytest.raises(NoiseKeyError):
        read_key(tmp_path / "missing")
    for text in ("zz" * 32, "ab" * 32 + " ", "é" * 64):
        with pytest.raises(NoiseKeyError):
            NoiseKey.from_hex(text)
    with pytest.raises(NoiseKeyError):
        NoiseKey(b"")
    with pytest.raises(NoiseKeyError):
        NoiseKey("a" * 64)  # type: ignore[arg-type]


def test_seeded_keys_are_reproducible_and_marked() -> None:
    a, b = NoiseKey.from_seed(7), NoiseKey.from_seed(7)
    assert a.reproducible and not NoiseKey(NoiseKey.generate()).reproducible
    wa, wb = KeyedStream(a, "x").words(0, 0, 8), KeyedStream(b, "x").words(0, 0, 8)
    assert wa.tolist() == wb.tolist()


def test_out_of_range_positions() -> None:
    st = _stream()
    assert len(st.words(0, 0, 0)) == 0
    for lane, start in [(-1, 0), (1 << 96, 0), (0, -1)]:
        with pytest.raises(ValueError):
            st.words(lane, start, 4)
    with pytest.raises(ValueError):
        st.words(0, 8 * (1 << 32), 1)  # beyond 2^32 ChaCha20 blocks in one lane


def test_config_names_the_key_format(tmp_path: Path) -> None:
    """The `noise_key_format` setting takes the reader's formats only (one list, rng.py)."""
    from processor.stream.model.config import ConfigError, load_settings

    cfg = tmp_path / "c.toml"
    cfg.write_text('allow_undeclared = true\nnoise_key_format = "raw"\n')
    assert load_settings(str(cfg), env={}).noise_key_format == "raw"
    assert load_settings(None, env={"DPC_ALLOW_UNDECLARED": "1"}).noise_key_format == "hex"
    cfg.write_text('allow_undeclared = true\nnoise_key_format = "auto"\n')
    with pytest.raises(ConfigError, match="noise_key_format"):
        load_settings(str(cfg), env={})


def test_entry_points_refuse_a_bad_key_file_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`count` and `worker` stop with exit 2 and the rule, never the content; with the
    format stated, the same entry point reads a raw file (control)."""
    from processor.commands.main import main
    from processor.stream.worker import app

    secret = bytes(range(7, 39))
    bad = tmp_path / "commented.key"
    bad.write_text(secret.hex() + "  # prod\n")
    args = ["count", "--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6",
            "--key-file", str(bad), "--input", str(tmp_path / "ticks")]
    (tmp_path / "ticks").write_text("1\n")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "64 hex digits" in err and secret.hex()[:12] not in err

    raw = tmp_path / "raw.key"
    raw.write_bytes(secret)
    assert main([*args[:-4], "--key-file", str(raw), "--key-format", "raw",
                 "--input", str(tmp_path / "ticks")]) == 0
    assert main([*args[:-4], "--key-file", str(raw), "--input", str(tmp_path / "ticks")]) == 2
    capsys.readouterr()

    # the worker: the same refusal before anything connects (no broker needed)
    monkeypatch.setattr(app, "configure_logging", lambda level, fmt="text": logging.DEBUG)
    for var in ("DPC_NOISE_KEY_FILE", "DPC_NOISE_KEY_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "w.toml"
    cfg.write_text(f'allow_undeclared = true\nnoise_key_file = "{bad}"\n')
    monkeypatch.setattr(app, "run_worker", lambda *a, **k: pytest.fail("key was accepted"))
    assert app.main_worker(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "noise key" in err and str(bad) in err and secret.hex()[:12] not in err


def test_derive_is_the_one_shot_hmac() -> None:
    """derive(label) is HMAC-SHA256(secret, "dp-stream-counts/v1/" + label) as the one-shot
    hmac.digest computes it, for labels of every length (empty, past SHA-256's 64-byte
    block, non-ASCII), in any order and again after the cache is emptied (the keyed state
    it copies is never fed). Controls: another label, another secret, or the label
    without the prefix give other keys."""
    secret = bytes(range(1, 33))
    key = NoiseKey(secret)
    labels = ["", "a", "c/ecc/part/svt1/z0", "c/ecc/part/svt1/skip", "x" * 63, "y" * 200,
              "pages[Zürich]/ecc/cc", "0123456789abcdef/c1/ecc/bcc"]
    want = [hmac.digest(secret, b"dp-stream-counts/v1/" + lb.encode(), "sha256")
            for lb in labels]
    assert [key.derive(lb) for lb in labels] == want
    key._derived.clear()
    assert [key.derive(lb) for lb in reversed(labels)] == want[::-1]
    assert key.derive("c/ecc/part/svt1/z1") != want[2]
    assert NoiseKey(bytes(32)).derive(labels[2]) != want[2]
    assert hmac.digest(secret, labels[2].encode(), "sha256") != want[2]
