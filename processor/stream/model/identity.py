"""What a counter's noise is keyed by and what names it in public, from public values only.

The noise identity of a deployment (`noise_identity`: app id, topics, configuration
fingerprint, key fingerprint), the label a counter's mechanism is keyed by under it
(`counter_id`), the public fingerprint of the noise key (`key_fingerprint`), the tag of
one creation of a counter (`creation_tag`, on its ledger entry) and the calibration a
mechanism runs under (`calibration_of`). The operator (the worker) and replay both derive
them here, so the two can never key or tag a counter differently.
"""

from __future__ import annotations

import hashlib

import orjson

from processor.core.api import Counter
from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings


def key_fingerprint(key: NoiseKey) -> str:
    """The public identifier of the noise key (HMAC-SHA256(key, "fingerprint"), 16 hex
    digits: `NoiseKey.fingerprint`): it names the key in the ledger and in the noise
    identity without revealing anything about its bytes."""
    return key.fingerprint()


def noise_identity(settings: Settings, key: NoiseKey, fingerprint: str | None = None) -> str:
    """THE noise identity of a deployment: everything that defines the computation whose
    noise it keys. The deployment (app id and the five topic names: another deployment is
    another computation, even with the same key), the privacy configuration (the
    fingerprint: mechanism, eps, delta, tick, declared counters...) and the key's public
    fingerprint. Any change draws unrelated noise, so noise is never shared by two
    computations on different data (whose difference would cancel it). Public: a hash of
    public values (32 hex digits), never key bytes. Bootstrap servers are left out on
    purpose: workers (and replay) of one deployment may reach the cluster by other names,
    and they must all draw the same noise. `fingerprint` (default the settings' own): an
    earlier configuration of this deployment, as its ledger entries name it (replay)."""
    t = settings.topics
    parts = {
        "v": 1,
        "app_id": settings.app_id,
        "topics": [t.input, t.timeline, t.counts, t.ledger, t.deadletter],
        "config": settings.fingerprint() if fingerprint is None else fingerprint,
        "key_id": key_fingerprint(key),
    }
    return hashlib.sha256(b"dpc/noise-identity/" + orjson.dumps(
        parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def counter_id(identity: str, counter: str) -> str:
    """The label a counter's mechanism is keyed by: its name under the noise identity."""
    return f"{identity}/{counter}"


def calibration_of(c: Counter) -> str:
    """The calibration a counter runs under ("paper" for mechanisms without one)."""
    return str(getattr(c, "calibration", "paper"))


def creation_tag(identity: str, counter: str, n: int, frontier: int) -> str:
    """The public tag of ONE creation of a counter (sha256, 32 hex digits): the noise
    identity it is created under, the counter, the marker that creates it (sealed through
    n) and the partition's frontier before that marker. Markers and public configuration
    only, like every public record: no event changes it.

    Re-executing that marker after a crash (ledger entry acknowledged, state not yet
    written) applies it to the same stored partition state: the same tag, and the same
    records. After a loss of state the partition starts from no frontier and the worker
    resumes past the creating marker, so a creation happens under another (frontier, n),
    or another identity: another tag, refused. A counter created by a partition's very
    first marker would meet its tag again at a second marker through the same tick: a
    worker never appends one (`app.last_marker`); what is left is in
    docs/privacy-notes.md."""
    msg = orjson.dumps([identity, counter, n, frontier])
    return hashlib.sha256(b"dpc/creation/" + msg).hexdigest()[:32]
