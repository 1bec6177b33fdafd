"""Versioned, compact state encoding shared by every mechanism.

Layout: b"DPS" + one version byte + orjson payload. The payload is a dict that always
holds "m" (the mechanism name) and the parameters needed to rebuild the instance, so a
state can never be restored into a mechanism with other parameters.

The counters' state dicts use short keys (stored bytes: never renamed). Those several
share: "k" the counter's kind, "e" epsilon, "d" delta, "n" horizon (ticks), "sen"
sensitivity (units), "lab" the noise label its KeyedStream is keyed by, "b" the base
counter of a CC, "t" ticks stepped, "p" the noise cursor's position, "s" the running sum
(units), "y" the last release (units), "z" the tree's noise, "l" and "is" CC's released
sum and its running interval's sum, "in" and "cc" a nested counter's state.
"""

from __future__ import annotations

from typing import Any

import orjson

from processor.core.errors import StateFormatError

MAGIC = b"DPS"


def pack(mechanism: str, version: int, payload: dict[str, Any]) -> bytes:
    return pack_owned(mechanism, version, dict(payload))


def pack_owned(mechanism: str, version: int, body: dict[str, Any]) -> bytes:
    """pack() of a dict the caller made for it and drops: adds "m" to it in place (no
    copy: a counter's state is encoded at every checkpoint that touched it)."""
    body["m"] = mechanism
    return MAGIC + bytes([version]) + orjson.dumps(body)


def unpack(data: bytes, mechanism: str, version: int) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StateFormatError("state must be bytes")
    data = bytes(data)
    if data[:3] != MAGIC or len(data) < 5:
        raise StateFormatError("not a mechanism state (bad magic)")
    if data[3] != version:
        raise StateFormatError(f"state version {data[3]} is not the supported version {version}")
    try:
        body = orjson.loads(data[4:])
    except orjson.JSONDecodeError:
        raise StateFormatError("state payload is corrupt") from None
    if not isinstance(body, dict) or body.get("m") != mechanism:
        got = body.get("m") if isinstance(body, dict) else None
        raise StateFormatError(f"state is for mechanism {got!r}, not {mechanism!r}")
    return body


def peek_mechanism(data: bytes) -> str:
    """The mechanism name inside a state, to dispatch `from_bytes`."""
    if bytes(data[:3]) != MAGIC:
        raise StateFormatError("not a mechanism state (bad magic)")
    try:
        body = orjson.loads(bytes(data[4:]))
    except orjson.JSONDecodeError:
        raise StateFormatError("state payload is corrupt") from None
    m = body.get("m") if isinstance(body, dict) else None
    if not isinstance(m, str):
        raise StateFormatError("state names no mechanism")
    return m
