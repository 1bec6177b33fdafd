"""Configuration of the stream processor: the ONE place settings are read.

`load_settings(path, env)` reads a TOML file (every field documented in
deploy/config.example.toml), applies `DPC_*` environment overrides on top, validates
everything and returns a frozen `Settings`. A bad value raises `ConfigError` naming the
field, so an operator sees "epsilon: must be a finite number > 0", never a stack trace
from deep inside the mechanism.

Secrets (the SASL password) never appear in repr/str; the noise key itself is not
configuration at all: only the path of the file that holds it.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final

import orjson

from processor.core.bounded import check_eps_delta
from processor.core.errors import InvalidParameterError, NoiseKeyError
from processor.core.grid import GRID_BITS
from processor.core.rng import KEY_FORMATS, NoiseKey
from processor.core.tight import CALIBRATIONS
from processor.core.unit import DERIVATIONS, UnitParameters, derive
from processor.errors import ProcessorError
from processor.keyfile import read_key
from processor.stream.model.families import MAX_FAMILY_NAME, OpenFamily

#: Mechanisms the stream layer may run: only those private under the queue shift.
STREAM_MECHANISMS = ("ecc", "simecc")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Values of on_parameter_change (see Settings).
PARAMETER_CHANGE_POLICIES = ("refuse", "keep")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: Longest accepted counter name (bytes of UTF-8); keeps state keys and records small.
MAX_COUNTER_NAME = 200
#: What a declared counter's name may be: a letter, digit or underscore (any script's),
#: then those and . : / @ + -. No white space, comma, `=` or quote: DPC_COUNTERS
#: ("name=start,...") and `send`'s short form ("counter,ts,...") split on them, and a
#: name with a space reads as two in every log and shell line that quotes it.
COUNTER_NAME_PATTERN = r"\w[\w.:/@+-]*"
_COUNTER_NAME_RE = re.compile(COUNTER_NAME_PATTERN)
#: Values of privacy_unit: "event" (each event is the unit; today's behaviour) or "user"
#: (the input's `user` field names the unit; contributions bounded, docs/privacy-unit.md).
PRIVACY_UNITS = ("event", "user")
#: The [unit] section's fields (privacy_unit = "user" only).
_UNIT_KEYS = ("epsilon", "delta", "max_events_per_counter", "max_counters_per_unit",
              "derivation", "confirm_migration")


#: Bounds of the derived checkpoint interval (Settings.checkpoint_interval_ms): the
#: interval of short ticks and lateness, and the most a crash makes the next owner
#: re-apply or the group's committed offsets trail the stream by default.
MIN_AUTO_CHECKPOINT_MS: Final = 500
MAX_AUTO_CHECKPOINT_MS: Final = 10_000


class ConfigError(ProcessorError, ValueError):
    """A configuration value that is missing, of the wrong type or outside its domain.

    `field` is the dotted name of the offending setting (e.g. "topics.input",
    "counters.signups"), so the message points at the line to fix.
    """

    error_prefix = "configuration: "

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}")


@dataclass(frozen=True)
class SecuritySettings:
    """How to reach the brokers: protocol, TLS files and SASL credentials."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    # repr=False: the password must never reach a log line through a repr of the settings.
    sasl_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TopicSettings:
    """Names of the five topics the processor reads and writes."""

    input: str = "dpc-input"
    timeline: str = "dpc-timeline"
    counts: str = "dpc-private-counts"
    ledger: str = "dpc-privacy-ledger"
    deadletter: str = "dpc-dead-letter"


@dataclass(frozen=True)
class Settings:
    """Every setting of the processor, validated. Build it with `load_settings` (or
    `Settings(...)` then `validate_settings` in tests)."""

    app_id: str = "dp-stream-counts"
    bootstrap_servers: str = "localhost:9092"
    security: SecuritySettings = field(default_factory=SecuritySettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    #: Partitions of the timeline topic (and of the operator's state table).
    partitions: int = 4
    #: Length of one tick of event time, in milliseconds.
    tick_ms: int = 1000
    #: How long after a tick's end the tick is sealed (events later than that are "late").
    lateness_ms: int = 2000
    #: Events stamped further than this into the future are rejected to the dead letters.
    max_future_ms: int = 60_000
    mechanism: str = "ecc"
    #: "paper" (the paper's constants) or "tight" (processor/core/tight.py, the project's
    #: own analysis: same (epsilon, delta), less noise; docs/tight-calibration.md).
    calibration: str = "paper"
    epsilon: float = 1.0
    delta: float = 1e-6
    #: Confidence of the published error bound: |y_t - s_t| <= bound w.p. >= 1 - beta.
    beta: float = 0.05
    #: A heartbeat release every this many ticks, even when y did not change.
    heartbeat_ticks: int = 60
    #: Spread heartbeats over the interval by a public per-counter phase (from the name), so
    #: counters that start together do not all come due at the same tick.
    heartbeat_spread: bool = True
    #: Declared counters: name -> start time (epoch ms, a multiple of tick_ms).
    counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: Accept events for undeclared counters (the counter starts at its first event's tick,
    #: which itself reveals that event's existence: off by default, see the example config).
    allow_undeclared: bool = False
    #: Open counter families: name -> its start and selection delta (families.py; a key's
    #: counter is published only once the private gate admits it, docs/open-keys.md).
    families: Mapping[str, OpenFamily] = field(default_factory=lambda: MappingProxyType({}))
    noise_key_file: str | None = None
    #: How the key file is read (processor.core.rng.KEY_FORMATS): "hex" (what keygen
    #: writes) or "raw" bytes. Stated, never guessed from the file's content.
    noise_key_format: str = "hex"
    state_dir: str = ".dpc-state"
    #: The operator metrics and health endpoints (processor/stream/worker/metrics.py): /metrics,
    #: /metrics/public, /healthz, /readyz on metrics_host:metrics_port (0: not served).
    #: Operator-only: /metrics reveals exact aggregate counts (docs/operator-channels.md).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    #: Serve the public metrics set (quantities derived from public data only) on a
    #: listener of its own, metrics_host:public_metrics_port, for a wider audience.
    public_metrics: bool = False
    public_metrics_port: int = 9465
    #: Standby copies of each state partition kept by other workers of the group (Faust's
    #: table_standby_replicas): a failed worker's counters move with little changelog to
    #: replay, at the cost of every worker also applying the others' changelogs.
    standby_replicas: int = 1
    #: How long applied state may stay in memory before a checkpoint makes it durable and
    #: acknowledges its timeline records to the consumer group (docs/state.md), in ms; or
    #: after checkpoint_records timeline records, whichever comes first. 0: derived,
    #: `checkpoint_interval_ms()`. A counter changed several times between two
    #: checkpoints is written once; a crash makes the next owner re-apply up to this much
    #: of the timeline. Releases are published at once, whatever it is.
    checkpoint_ms: int = 0
    checkpoint_records: int = 2000
    #: What a worker does when a counter restored from state has another mechanism,
    #: epsilon or delta than this configuration: "refuse" (stop with an error naming the
    #: field and the counter) or "keep" (each existing counter continues under its stored
    #: parameters, which its releases carry, and a "reconfigured" ledger entry before its
    #: first release under the new fingerprint says so; a restart with new noise would
    #: republish ticks already released, which the ledger refusal forbids).
    on_parameter_change: str = "refuse"
    #: retention.ms given to topics this processor creates (-1: forever; the ledger is
    #: always kept forever). The timeline is what replay recomputes from, so its retention
    #: is the audit window; the private counts are compared with it (docs/downstream.md).
    timeline_retention_ms: int = -1
    counts_retention_ms: int = -1
    #: Raw rejected input (a private topic): kept a week for an operator to look at.
    deadletter_retention_ms: int = 604_800_000
    #: "event" (default: every guarantee is per event, exactly as before) or "user": the
    #: guarantee is per unit named by each event's `user` field, the stream bounds each
    #: unit's contributions and epsilon/delta above are DERIVED from the [unit] target
    #: (docs/privacy-unit.md). Only with "user" are the four fields below set.
    privacy_unit: str = "event"
    #: The target per unit (eps_unit, delta_unit) and the lifetime contribution bounds k
    #: (kept events of one unit per counter) and m (counters per unit).
    unit_epsilon: float | None = None
    unit_delta: float | None = None
    max_events_per_counter: int = 1
    max_counters_per_unit: int = 1
    #: unit.derivation: "coupling" (default: the k-edit coupling where it is more
    #: accurate) or "basic" (what user-mode deployments made before it derived; set it to
    #: keep their per-event parameters, which their stored counters were made with).
    unit_derivation: str = "coupling"
    #: unit.confirm_migration: the operator confirms a change of the unit target, bounds,
    #: derivation, mechanism or calibration under a ledger that states others; the ledger
    #: entries then state the guarantee composed over every configuration
    #: (processor/stream/model/lifetime.py, docs/privacy-unit.md). Not in the fingerprint: it
    #: changes what the entries state, never how a counter runs.
    unit_confirm_migration: bool = False

    def unit_parameters(self) -> UnitParameters | None:
        """The derivation behind epsilon/delta in "user" mode (None in "event" mode)."""
        if self.privacy_unit != "user":
            return None
        cached: UnitParameters | None = self.__dict__.get("_unit_parameters")
        if cached is None:
            assert self.unit_epsilon is not None and self.unit_delta is not None
            cached = _derive(self.unit_epsilon, self.unit_delta, self.max_events_per_counter,
                             self.max_counters_per_unit, self.mechanism, self.calibration,
                             self.unit_derivation)
            object.__setattr__(self, "_unit_parameters", cached)
        return cached

    def gate_delta0(self, family: str) -> float:
        """The admission gate's delta0 of `family`'s keys: its selection_delta over the
        keys one unit touches at the epsilon the releases hold at (docs/open-keys.md):
        one key at the per-event epsilon in event mode, m at the unit's in user mode
        (keys count towards max_counters_per_unit as counters do)."""
        fam = self.families[family]
        if self.privacy_unit == "user":
            assert self.unit_epsilon is not None
            return fam.delta0(self.unit_epsilon, self.max_counters_per_unit)
        return fam.delta0(self.epsilon)

    def checkpoint_interval_ms(self) -> int:
        """checkpoint_ms, or when it is 0, twice lateness_ms + tick_ms within
        [MIN_AUTO_CHECKPOINT_MS, MAX_AUTO_CHECKPOINT_MS]: an event changes its counter at
        its arrival and again when the marker sealing its tick steps it, up to
        lateness_ms + tick_ms later; with twice that interval both changes fall in one
        checkpoint at least half the time, and a counter is written once for them."""
        if self.checkpoint_ms:
            return self.checkpoint_ms
        return max(MIN_AUTO_CHECKPOINT_MS,
                   min(MAX_AUTO_CHECKPOINT_MS, 2 * (self.lateness_ms + self.tick_ms)))

    def fingerprint(self) -> str:
        """sha256 (hex) of the privacy-relevant settings: public, printed in every release
        and ledger entry, so a consumer can tell which configuration produced a value."""
        cached: str | None = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        relevant = {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "tick_ms": self.tick_ms,
            "counters": sorted(self.counters.items()),
            "allow_undeclared": self.allow_undeclared,
            "grid_bits": GRID_BITS,
            "contribution_bound": 1,
        }
        if self.calibration != "paper":
            # Only when set: the fingerprints (and noise identities) of existing
            # deployments, all "paper", stay what they were.
            relevant["calibration"] = self.calibration
        if self.privacy_unit != "event":
            # Likewise only when set: event-mode fingerprints are unchanged.
            relevant["privacy_unit"] = self.privacy_unit
            relevant["unit_epsilon"] = self.unit_epsilon
            relevant["unit_delta"] = self.unit_delta
            relevant["contribution_bound"] = [self.max_events_per_counter,
                                              self.max_counters_per_unit]
        if self.families:
            # Only when set: the fingerprints of deployments without families are unchanged.
            relevant["families"] = sorted(
                (n, f.start_ms, f.selection_delta) for n, f in self.families.items())
        fp = hashlib.sha256(orjson.dumps(relevant, option=orjson.OPT_SORT_KEYS)).hexdigest()
        # Memoised (the settings are frozen): with 10^4 counters hashing costs milliseconds,
        # and the operator asks once per new counter.
        object.__setattr__(self, "_fingerprint", fp)
        return fp

    def __hash__(self) -> int:
        # The generated hash would fail on the counters mapping; equal settings have equal
        # reprs (the password is the only field left out, and it does not need to be in).
        return hash(repr(self))


# ----------------------------------------------------------------------------- parsing

_TOP_KEYS = {
    "app_id", "bootstrap_servers", "partitions", "tick_ms", "lateness_ms", "max_future_ms",
    "mechanism", "calibration", "epsilon", "delta", "beta", "heartbeat_ticks",
    "heartbeat_spread",
    "allow_undeclared",
    "noise_key_file", "noise_key_format", "state_dir",
    "metrics_host", "metrics_port", "public_metrics", "public_metrics_port",
    "standby_replicas", "checkpoint_ms", "checkpoint_records", "on_parameter_change",
    "timeline_retention_ms", "counts_retention_ms", "deadletter_retention_ms",
    "privacy_unit",
}
_SECTIONS = {"security", "topics", "counters", "unit", "families"}
#: The fields of one [families] entry.
_FAMILY_KEYS = ("open", "start", "selection_delta")
#: One table of the file: setting -> raw value (TOML or environment text).
Table = dict[str, Any]

# Environment overrides: variable -> (section or "", field). DPC_* wins over the legacy
# KAFKA_BOOTSTRAP_SERVERS, which is honoured because the deploy scripts and CI export it.
_ENV: dict[str, tuple[str, str]] = {f"DPC_{k.upper()}": ("", k) for k in _TOP_KEYS}
_ENV.update({f"DPC_{f.name.upper()}": ("security", f.name) for f in fields(SecuritySettings)})
_ENV.update({f"DPC_TOPIC_{f.name.upper()}": ("topics", f.name) for f in fields(TopicSettings)})
# Named after the Settings fields: DPC_UNIT_EPSILON, DPC_UNIT_DELTA,
# DPC_MAX_EVENTS_PER_COUNTER, DPC_MAX_COUNTERS_PER_UNIT, DPC_UNIT_DERIVATION,
# DPC_UNIT_CONFIRM_MIGRATION.
_ENV.update({f"DPC_{k.upper() if k.startswith('max_') else 'UNIT_' + k.upper()}": ("unit", k)
             for k in _UNIT_KEYS})
#: Every environment variable `load_settings` reads (the development tooling strips them
#: from a worker's environment so that its config file alone decides its settings).
SETTINGS_ENV_VARS = frozenset({*_ENV, "DPC_COUNTERS", "KAFKA_BOOTSTRAP_SERVERS"})


def _as_int(name: str, v: object, minimum: int) -> int:
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise ConfigError(name, "must be an integer") from None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(name, "must be an integer")
    if v < minimum:
        raise ConfigError(name, f"must be >= {minimum}")
    return v


def _as_float(name: str, v: object) -> float:
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise ConfigError(name, "must be a number") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(name, "must be a number")
    f = float(v)
    if not math.isfinite(f):
        raise ConfigError(name, "must be finite")
    return f


def _as_bool(name: str, v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, "must be true or false")


def _as_str(name: str, v: object, *, optional: bool = False) -> str | None:
    if v is None or (optional and v == ""):
        if optional:
            return None
        raise ConfigError(name, "is required")
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(name, "must be a non-empty string")
    return v


def _start_ms(name: str, v: object) -> int:
    """A counter start: epoch ms (int) or an ISO-8601 time with a zone."""
    if isinstance(v, datetime):  # TOML has a native datetime type
        if v.tzinfo is None:
            raise ConfigError(name, "a start time needs a time zone (e.g. Z)")
        return int(v.timestamp() * 1000)
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip())
        except ValueError:
            return _as_int(name, v, 0)
        return _start_ms(name, dt)
    return _as_int(name, v, 0)


def _parse_counters_env(text: str) -> dict[str, object]:
    """DPC_COUNTERS="a=0,b=2026-01-01T00:00:00Z": replaces the declared counters."""
    out: dict[str, object] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, start = item.partition("=")
        if not sep:
            raise ConfigError("counters", "DPC_COUNTERS items must look like name=start_ms")
        out[name.strip()] = start.strip()
    return out


def load_settings(path: str | None = None, env: Mapping[str, str] = os.environ) -> Settings:
    """Read settings from the TOML file `path` (None: defaults only), then apply the
    DPC_* overrides in `env`, then validate. Raises ConfigError naming the bad field."""
    raw = _read_toml(path) if path is not None else {}
    top, sec, topics, counters, unit = _sections(raw)
    if "KAFKA_BOOTSTRAP_SERVERS" in env and "DPC_BOOTSTRAP_SERVERS" not in env:
        top["bootstrap_servers"] = env["KAFKA_BOOTSTRAP_SERVERS"]
    targets = {"": top, "security": sec, "topics": topics, "unit": unit}
    for var, (section, name) in _ENV.items():
        if var in env:
            targets[section][name] = env[var]
    if "DPC_COUNTERS" in env:
        counters = _parse_counters_env(env["DPC_COUNTERS"])
    try:
        return _build(top, sec, topics, counters, unit, _families(raw))
    except ConfigError as exc:
        if path is None and exc.field == "counters" and not counters:
            # `worker` without --config: say what is missing first, not a field of it.
            raise ConfigError("counters", "no configuration file and no counter: give "
                              "--config F (deploy/config.example.toml documents every "
                              "field) or DPC_COUNTERS=name=start") from None
        raise


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return toml_loads(fh.read().decode())
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("config", f"not valid TOML: not UTF-8 ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"not valid TOML: {exc}") from None


#: One line of a [counters] table as `processor.devtools.deployment.render_toml` writes
#: it: a basic-string key without escapes, or a bare key, = a decimal integer without
#: sign, underscores or leading zero. TOML reads such a line as exactly this key and int.
_COUNTER_LINE = re.compile(
    r'^(?:"([A-Za-z0-9_.:/@+-]+)"|([A-Za-z0-9_-]+)) = (0|[1-9][0-9]*)$', re.M)


def toml_loads(text: str) -> dict[str, Any]:
    """`tomllib.loads(text)`, the same dict, with a [counters] table of plain lines
    (`_COUNTER_LINE`, one per counter, no blank line) read by one regular expression
    instead of tomllib's per-key parser (a tenth of its time: a million counters take
    seconds through tomllib). Anything else, in the table or around it (a counters key
    elsewhere, a duplicate name, multi-line strings), goes to tomllib whole."""
    head, sep, rest = ("\n" + text).partition("\n[counters]\n")
    if not sep or '"""' in text or "'''" in text:
        return tomllib.loads(text)
    body, more, tail = rest.partition("\n[")
    body = body.rstrip("\n")
    found = _COUNTER_LINE.findall(body)
    if "\n\n" in body or len(found) != (body.count("\n") + 1 if body else 0):
        return tomllib.loads(text)
    counters = {quoted or bare: int(start) for quoted, bare, start in found}
    if len(counters) != len(found):
        return tomllib.loads(text)
    raw = tomllib.loads(head + "\n" + ("[" + tail if more else ""))
    if "counters" in raw:
        return tomllib.loads(text)
    raw["counters"] = counters
    return raw


def _sections(raw: Mapping[str, Any]) -> tuple[Table, Table, Table, Table, Table]:
    """The file's top-level settings and its security, topics, counters and unit tables,
    each a fresh dict; ConfigError for a key no section knows (a typo)."""
    for key, value in raw.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(key, "must be a table")
        elif key not in _TOP_KEYS:
            raise ConfigError(key, "unknown setting (typo?)")
    known = {"security": {f.name for f in fields(SecuritySettings)},
             "topics": {f.name for f in fields(TopicSettings)},
             "unit": set(_UNIT_KEYS)}
    for section, names in known.items():
        for k in raw.get(section, {}):
            if k not in names:
                raise ConfigError(f"{section}.{k}", "unknown setting (typo?)")
    top = {k: v for k, v in raw.items() if k in _TOP_KEYS}

    def table(name: str) -> Table:
        return dict(raw.get(name, {}))

    return top, table("security"), table("topics"), table("counters"), table("unit")


def _families(raw: Mapping[str, Any]) -> dict[str, OpenFamily]:
    """The [families] table: name -> { open = true, start = ..., selection_delta = ... }."""
    out: dict[str, OpenFamily] = {}
    for name, entry in dict(raw.get("families", {})).items():
        where = f"families.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(where, "must be a table { open = true, start = ..., "
                              "selection_delta = ... }")
        for k in entry:
            if k not in _FAMILY_KEYS:
                raise ConfigError(f"{where}.{k}", "unknown setting (typo?)")
        if entry.get("open") is not True:
            raise ConfigError(f"{where}.open", "must be true (the only kind of family)")
        for k in ("start", "selection_delta"):
            if k not in entry:
                raise ConfigError(f"{where}.{k}", "is required")
        out[name] = OpenFamily(_start_ms(f"{where}.start", entry["start"]),
                               _as_float(f"{where}.selection_delta",
                                         entry["selection_delta"]))
    return out


def _unit_fields(top: dict[str, Any], unit: dict[str, Any], mechanism: str,
                 calibration: str) -> dict[str, Any]:
    """privacy_unit and the [unit] fields, checked; in "user" mode also the DERIVED
    epsilon and delta (which must then not be configured: they would contradict the
    target; they depend on the mechanism and calibration). ConfigError names the field."""
    mode = _as_str("privacy_unit", top.get("privacy_unit", "event"))
    _check_choice("privacy_unit", mode, PRIVACY_UNITS)
    out: dict[str, Any] = {"privacy_unit": mode}
    if mode == "event":
        if unit:
            raise ConfigError("unit", 'the [unit] section needs privacy_unit = "user"')
        return out
    for name in ("epsilon", "delta"):
        if name in top:
            raise ConfigError(name, 'is derived from unit.epsilon and unit.delta when '
                              'privacy_unit = "user" (docs/privacy-unit.md): remove it')
    for name in ("epsilon", "delta", "max_events_per_counter", "max_counters_per_unit"):
        if name not in unit:
            raise ConfigError(f"unit.{name}", 'is required when privacy_unit = "user"')
    out["unit_epsilon"] = _as_float("unit.epsilon", unit["epsilon"])
    out["unit_delta"] = _as_float("unit.delta", unit["delta"])
    out["max_events_per_counter"] = _as_int(
        "unit.max_events_per_counter", unit["max_events_per_counter"], 1)
    out["max_counters_per_unit"] = _as_int(
        "unit.max_counters_per_unit", unit["max_counters_per_unit"], 1)
    if "derivation" in unit:
        out["unit_derivation"] = _as_str("unit.derivation", unit["derivation"])
        _check_choice("unit.derivation", out["unit_derivation"], DERIVATIONS)
    if "confirm_migration" in unit:
        out["unit_confirm_migration"] = _as_bool("unit.confirm_migration",
                                                   unit["confirm_migration"])
    p = _derive(out["unit_epsilon"], out["unit_delta"], out["max_events_per_counter"],
                out["max_counters_per_unit"], mechanism, calibration,
                out.get("unit_derivation", "coupling"))
    out["epsilon"], out["delta"] = p.event_epsilon, p.event_delta
    return out


def _derive(eps: float, delta: float, k: int, m: int, mechanism: str,
            calibration: str, derivation: str = "coupling") -> UnitParameters:
    """unit.derive for this mechanism and calibration, its error as a ConfigError naming
    the [unit] field (an unknown calibration or derivation is left to its own check,
    which names it)."""
    try:
        return derive(eps, delta, k, m, mechanism=mechanism,
                      calibration=calibration if calibration in CALIBRATIONS else "paper",
                      derivation=derivation if derivation in DERIVATIONS else "coupling")
    except InvalidParameterError as exc:
        text = str(exc)
        name = next((f"unit.{f}" for f in ("max_events_per_counter", "max_counters_per_unit")
                     if f in text), "unit.delta" if "delta" in text else "unit.epsilon")
        raise ConfigError(name, text) from None


def with_unit(s: Settings, unit_epsilon: float, unit_delta: float,
              max_events_per_counter: int, max_counters_per_unit: int) -> Settings:
    """A validated copy of `s` in privacy_unit = "user" mode, epsilon/delta derived
    (tests, the bench, the audit)."""
    p = _derive(unit_epsilon, unit_delta, max_events_per_counter, max_counters_per_unit,
                s.mechanism, s.calibration)
    return validate_settings(replace(
        s, privacy_unit="user", unit_epsilon=float(unit_epsilon),
        unit_delta=float(unit_delta), max_events_per_counter=max_events_per_counter,
        max_counters_per_unit=max_counters_per_unit, epsilon=p.event_epsilon,
        delta=p.event_delta))


def _build(top: dict[str, Any], sec: dict[str, Any], topics: dict[str, Any],
           counters: dict[str, Any], unit: dict[str, Any] | None = None,
           families: dict[str, OpenFamily] | None = None) -> Settings:
    d = Settings()
    s: dict[str, Any] = {}
    s["app_id"] = _as_str("app_id", top.get("app_id", d.app_id))
    s["bootstrap_servers"] = _as_str(
        "bootstrap_servers", top.get("bootstrap_servers", d.bootstrap_servers))
    s["partitions"] = _as_int("partitions", top.get("partitions", d.partitions), 1)
    s["tick_ms"] = _as_int("tick_ms", top.get("tick_ms", d.tick_ms), 1)
    s["lateness_ms"] = _as_int("lateness_ms", top.get("lateness_ms", d.lateness_ms), 0)
    s["max_future_ms"] = _as_int("max_future_ms", top.get("max_future_ms", d.max_future_ms), 0)
    s["mechanism"] = _as_str("mechanism", top.get("mechanism", d.mechanism))
    s["calibration"] = _as_str("calibration", top.get("calibration", d.calibration))
    s["epsilon"] = _as_float("epsilon", top.get("epsilon", d.epsilon))
    s["delta"] = _as_float("delta", top.get("delta", d.delta))
    s.update(_unit_fields(top, unit or {}, s["mechanism"], s["calibration"]))
    s["beta"] = _as_float("beta", top.get("beta", d.beta))
    s["heartbeat_ticks"] = _as_int(
        "heartbeat_ticks", top.get("heartbeat_ticks", d.heartbeat_ticks), 1)
    s["heartbeat_spread"] = _as_bool(
        "heartbeat_spread", top.get("heartbeat_spread", d.heartbeat_spread))
    s["allow_undeclared"] = _as_bool(
        "allow_undeclared", top.get("allow_undeclared", d.allow_undeclared))
    s["noise_key_file"] = _as_str(
        "noise_key_file", top.get("noise_key_file", d.noise_key_file), optional=True)
    s["noise_key_format"] = _as_str(
        "noise_key_format", top.get("noise_key_format", d.noise_key_format))
    s["state_dir"] = _as_str("state_dir", top.get("state_dir", d.state_dir))
    s["metrics_host"] = _as_str("metrics_host", top.get("metrics_host", d.metrics_host))
    s["metrics_port"] = _as_int("metrics_port", top.get("metrics_port", d.metrics_port), 0)
    s["public_metrics"] = _as_bool(
        "public_metrics", top.get("public_metrics", d.public_metrics))
    s["public_metrics_port"] = _as_int(
        "public_metrics_port", top.get("public_metrics_port", d.public_metrics_port), 1)
    s["standby_replicas"] = _as_int(
        "standby_replicas", top.get("standby_replicas", d.standby_replicas), 0)
    s["checkpoint_ms"] = _as_int(
        "checkpoint_ms", top.get("checkpoint_ms", d.checkpoint_ms), 0)
    s["checkpoint_records"] = _as_int(
        "checkpoint_records", top.get("checkpoint_records", d.checkpoint_records), 1)
    s["on_parameter_change"] = _as_str(
        "on_parameter_change", top.get("on_parameter_change", d.on_parameter_change))
    for name in ("timeline_retention_ms", "counts_retention_ms", "deadletter_retention_ms"):
        s[name] = _as_int(name, top.get(name, getattr(d, name)), -1)

    sd: dict[str, Any] = {}
    for f in fields(SecuritySettings):
        default = getattr(SecuritySettings(), f.name)
        sd[f.name] = _as_str(f"security.{f.name}", sec.get(f.name, default), optional=True)
    if sd["security_protocol"] is None:
        sd["security_protocol"] = "PLAINTEXT"
    td: dict[str, Any] = {}
    for f in fields(TopicSettings):
        td[f.name] = _as_str(f"topics.{f.name}", topics.get(f.name, getattr(TopicSettings(),
                                                                             f.name)))
    cd: dict[str, int] = {}
    for name, start in counters.items():
        cd[name] = _start_ms(f"counters.{name}", start)

    settings = Settings(security=SecuritySettings(**sd), topics=TopicSettings(**td),
                        counters=MappingProxyType(cd),
                        families=MappingProxyType(dict(families or {})), **s)
    validate_settings(settings)
    return settings


def validate_settings(s: Settings) -> Settings:
    """Check every rule, part by part (the first problem found is raised); return `s`
    unchanged or raise ConfigError."""
    _check_unit(s)
    _check_privacy(s)
    _check_choice("on_parameter_change", s.on_parameter_change, PARAMETER_CHANGE_POLICIES)
    _check_retention(s)
    _check_choice("noise_key_format", s.noise_key_format, KEY_FORMATS)
    _check_sizes(s)
    _check_security(s.security)
    _check_topics(s.topics)
    _check_counters(s)
    _check_families(s)
    _check_metrics(s)
    return s


def _check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}")


def _check_privacy(s: Settings) -> None:
    """The mechanism, (epsilon, delta), beta and the calibration; and that the mechanism
    can run with them."""
    if s.mechanism not in STREAM_MECHANISMS:
        raise ConfigError("mechanism", f"must be one of {', '.join(STREAM_MECHANISMS)} "
                          "(the mechanisms private under the queue shift)")
    try:
        # The core's own check, the one every mechanism runs on its parameters.
        check_eps_delta(s.epsilon, s.delta)
    except InvalidParameterError as exc:
        # Name the field to fix: if eps passes with a valid delta, delta is the bad one.
        eps_ok = _core_accepts(s.epsilon, 0.5)
        raise ConfigError("delta" if eps_ok else "epsilon", str(exc)) from None
    if not 0 < s.beta < 1:
        raise ConfigError("beta", "must be in (0, 1)")
    _check_choice("calibration", s.calibration, CALIBRATIONS)
    try:
        _check_mechanism(s.mechanism, s.epsilon, s.delta, s.beta, s.calibration)
    except ConfigError as exc:
        if s.privacy_unit != "user":
            raise
        raise ConfigError("unit", f"the per-event parameters derived from the unit target "
                          f"(epsilon {s.epsilon!r}, delta {s.delta!r}) are unusable: "
                          f"{exc.message}; raise unit.epsilon or unit.delta, or lower "
                          "the bounds") from None


def _check_sizes(s: Settings) -> None:
    """The integer settings of the stream's shape and timing."""
    for name, v, lo in (("partitions", s.partitions, 1), ("tick_ms", s.tick_ms, 1),
                        ("lateness_ms", s.lateness_ms, 0),
                        ("max_future_ms", s.max_future_ms, 0),
                        ("heartbeat_ticks", s.heartbeat_ticks, 1),
                        ("standby_replicas", s.standby_replicas, 0),
                        ("checkpoint_ms", s.checkpoint_ms, 0),
                        ("checkpoint_records", s.checkpoint_records, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(name, f"must be an integer >= {lo}")


def _check_security(sec: SecuritySettings) -> None:
    _check_choice("security.security_protocol", sec.security_protocol, SECURITY_PROTOCOLS)
    if sec.security_protocol.startswith("SASL"):
        if sec.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError("security.sasl_mechanism",
                              f"must be one of {', '.join(SASL_MECHANISMS)} with SASL")
        if not sec.sasl_username:
            raise ConfigError("security.sasl_username", "is required with SASL")
        if not sec.sasl_password:
            raise ConfigError("security.sasl_password", "is required with SASL")
    if (sec.ssl_certfile is None) != (sec.ssl_keyfile is None):
        raise ConfigError("security.ssl_keyfile", "ssl_certfile and ssl_keyfile go together")


def _check_topics(topics: TopicSettings) -> None:
    for f in fields(TopicSettings):
        name = getattr(topics, f.name)
        if not isinstance(name, str) or not _TOPIC_RE.match(name):
            raise ConfigError(f"topics.{f.name}", "not a valid Kafka topic name")
    names = [getattr(topics, f.name) for f in fields(TopicSettings)]
    if len(set(names)) != len(names):
        raise ConfigError("topics", "the five topics must have distinct names")


def _check_counters(s: Settings) -> None:
    """Declared counters: names, starts on the tick grid; at least one unless undeclared
    counters are allowed."""
    for name, start in s.counters.items():
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_COUNTER_NAME:
            raise ConfigError("counters", f"counter names must be 1..{MAX_COUNTER_NAME} bytes")
        if not _COUNTER_NAME_RE.fullmatch(name):
            raise ConfigError("counters", f"counter name {name!r} does not match "
                              f"{COUNTER_NAME_PATTERN} (letters, digits, _ . : / @ + -; no "
                              "spaces, commas, '=' or quotes)")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigError(f"counters.{name}", "start must be epoch ms >= 0")
        if start % s.tick_ms:
            raise ConfigError(f"counters.{name}",
                              f"start must be a multiple of tick_ms ({s.tick_ms})")
    if not s.counters and not s.allow_undeclared and not s.families:
        raise ConfigError("counters", "declare at least one counter or open family (or set "
                          "allow_undeclared)")


def _check_families(s: Settings) -> None:
    """Open families: names as declared counters' (at most MAX_FAMILY_NAME bytes) and
    none of them, starts on the tick grid, delta_sel the gate can meet; no undeclared
    counters beside them (the gate's proof assumes no counter named like a key's), and
    the bases the gate covers (ECC and SimECC run BLT)."""
    for name, fam in s.families.items():
        where = f"families.{name}"
        if (not isinstance(name, str) or not _COUNTER_NAME_RE.fullmatch(name)
                or len(name.encode()) > MAX_FAMILY_NAME):
            raise ConfigError("families", f"family names must match {COUNTER_NAME_PATTERN} "
                              f"and be 1..{MAX_FAMILY_NAME} bytes")
        if name in s.counters:
            raise ConfigError(where, "is also a declared counter: one name, one meaning")
        if not isinstance(fam, OpenFamily):
            raise ConfigError(where, "must be an OpenFamily")
        if fam.start_ms < 0 or fam.start_ms % s.tick_ms:
            raise ConfigError(f"{where}.start", "must be epoch ms >= 0, a multiple of tick_ms")
        if not 0.0 < fam.selection_delta < 1.0:
            raise ConfigError(f"{where}.selection_delta", "must be in (0, 1)")
        try:
            s.gate_delta0(name)
        except InvalidParameterError as exc:
            raise ConfigError(f"{where}.selection_delta", str(exc)) from None
    if s.families and s.unit_confirm_migration:
        # A key not admitted keeps the per-event parameters it was made with and is on
        # no ledger: a composition over the ledger's statements could miss them.
        raise ConfigError("unit.confirm_migration", "must be false beside open families "
                          "(keys not admitted are on no ledger the migration could compose)")
    if s.families and s.allow_undeclared:
        raise ConfigError("allow_undeclared", "must be false beside open families (an "
                          "undeclared counter could be named like a key's)")


def _check_metrics(s: Settings) -> None:
    for name, port, lo in (("metrics_port", s.metrics_port, 0),
                           ("public_metrics_port", s.public_metrics_port, 1)):
        if isinstance(port, bool) or not isinstance(port, int) or not lo <= port <= 65535:
            raise ConfigError(name, f"must be an integer in {lo}..65535")
    if not isinstance(s.metrics_host, str) or not s.metrics_host:
        raise ConfigError("metrics_host", "must be a host name or address")
    if s.public_metrics and s.public_metrics_port == s.metrics_port:
        # One port would put the operator endpoint wherever the public one is reachable.
        raise ConfigError("public_metrics_port", "must differ from metrics_port")


#: Local ticks through which the configuration check requires a finite error bound.
#: The bound is non-decreasing in t; 2^12 keeps the check cheap for SimECC, whose skip
#: costs one step per SimPart checkpoint.
CHECK_TICKS: Final = 1 << 12


@lru_cache(maxsize=64)
def _mechanism_problem(mechanism: str, eps: float, delta: float, beta: float,
                       calibration: str = "paper") -> str | None:
    """Why the core cannot run `mechanism` at (eps, delta), or None: builds one instance
    with a throwaway key (never the real one: nothing of it is published or kept) for one
    counter name, skips CHECK_TICKS ticks and computes the error bound once. The core
    raises on some parameters (BCC's eta underflows to 0 for epsilon above ~812 at
    delta 1e-6; a delta near 1e-308 overflows a float-to-int conversion) and returns an
    infinite bound on others (a tail factor overflows for a tiny eta), so both count."""
    from processor.core import registry
    from processor.core.rng import NoiseKey

    try:
        c = registry.make(mechanism, eps, delta, NoiseKey(bytes(range(32))), "config-check",
                          calibration=calibration)
        c.skip(CHECK_TICKS)
        bound = c.error_bound(beta)
    except (ArithmeticError, ValueError) as exc:  # InvalidParameterError is a ValueError
        return f"the mechanism cannot run with it ({type(exc).__name__}: {exc})"
    if not math.isfinite(bound):
        return "the mechanism's error bound is not finite with it"
    return None


def _check_mechanism(mechanism: str, eps: float, delta: float, beta: float,
                     calibration: str = "paper") -> None:
    """ConfigError naming epsilon or delta when the configured mechanism cannot run: the
    start stops here rather than at the first marker. epsilon is named when it fails with
    the default delta, delta when it fails with epsilon 1, else delta with epsilon given
    (the two underflow together)."""
    problem = _mechanism_problem(mechanism, eps, delta, beta, calibration)
    if problem is None:
        return
    d = Settings()
    if _mechanism_problem(mechanism, eps, d.delta, beta, calibration) is not None:
        raise ConfigError("epsilon", f"{eps!r} is unusable for {mechanism}: {problem}")
    if _mechanism_problem(mechanism, 1.0, delta, beta, calibration) is not None:
        raise ConfigError("delta", f"{delta!r} is unusable for {mechanism}: {problem}")
    raise ConfigError("delta", f"{delta!r} is unusable for {mechanism} with epsilon = "
                      f"{eps!r} (use a larger delta or a smaller epsilon): {problem}")


#: The shortest finite timeline retention: a worker down longer than the timeline's
#: retention loses the events it has not applied, and replay needs the whole timeline.
MIN_TIMELINE_RETENTION_MS: Final = 604_800_000


def _check_retention(s: Settings) -> None:
    """Retentions are -1 (forever) or positive; the timeline's at least a week; the
    private counts' at least the timeline's (replay compares every release it recomputes
    from the timeline with the published one)."""
    def forever(ms: int) -> float:
        return math.inf if ms == -1 else ms

    for name in ("timeline_retention_ms", "counts_retention_ms", "deadletter_retention_ms"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or v > 0):
            raise ConfigError(name, "must be -1 (forever) or a number of milliseconds > 0")
    if forever(s.timeline_retention_ms) < MIN_TIMELINE_RETENTION_MS:
        raise ConfigError("timeline_retention_ms",
                          f"must be -1 (forever) or >= {MIN_TIMELINE_RETENTION_MS} (7 days): "
                          "replay recomputes from the whole timeline (the audit window)")
    if forever(s.counts_retention_ms) < forever(s.timeline_retention_ms):
        raise ConfigError("counts_retention_ms", "must be at least timeline_retention_ms "
                          "(-1 is forever): replay compares every release it recomputes")


def _check_unit(s: Settings) -> None:
    """privacy_unit and the [unit] fields: "event" with none of them set; "user" with all
    of them valid, declared counters only, and epsilon/delta equal to the derivation."""
    _check_choice("privacy_unit", s.privacy_unit, PRIVACY_UNITS)
    if s.privacy_unit == "event":
        if (s.unit_epsilon, s.unit_delta, s.max_events_per_counter,
                s.max_counters_per_unit, s.unit_derivation, s.unit_confirm_migration
                ) != (None, None, 1, 1, "coupling", False):
            raise ConfigError("unit", 'the [unit] fields need privacy_unit = "user"')
        return
    if s.unit_epsilon is None or s.unit_delta is None:
        raise ConfigError("unit.epsilon", 'is required when privacy_unit = "user"')
    _check_choice("unit.derivation", s.unit_derivation, DERIVATIONS)
    p = _derive(s.unit_epsilon, s.unit_delta, s.max_events_per_counter,
                s.max_counters_per_unit, s.mechanism, s.calibration, s.unit_derivation)
    if (s.epsilon, s.delta) != (p.event_epsilon, p.event_delta):
        raise ConfigError("epsilon", "must be the per-event epsilon and delta derived from "
                          f"the unit target ({p.event_epsilon!r}, {p.event_delta!r})")
    if s.allow_undeclared:
        # A counter created at its first event reveals that event; no per-event
        # guarantee covers it, so no per-unit one does (docs/privacy-unit.md).
        raise ConfigError("allow_undeclared", 'must be false when privacy_unit = "user"')


def _core_accepts(eps: float, delta: float) -> bool:
    try:
        check_eps_delta(eps, delta)
    except InvalidParameterError:
        return False
    return True


def with_overrides(s: Settings, **changes: Any) -> Settings:
    """A validated copy of `s` with some fields replaced (tests, the demo)."""
    if "counters" in changes:
        changes["counters"] = MappingProxyType(dict(changes["counters"]))
    if "families" in changes:
        changes["families"] = MappingProxyType(dict(changes["families"]))
    return validate_settings(replace(s, **changes))


def load_noise_key(settings: Settings, key_file: str | None = None,
                   key_format: str | None = None) -> NoiseKey:
    """The noise key of a deployment: `key_file` / `key_format` (command-line overrides)
    or the configured noise_key_file / noise_key_format. The one key reader of the worker
    and replay; NoiseKeyError (never the key's content) when none is configured or the
    file breaks the format rule."""
    path = key_file or settings.noise_key_file
    if not path:
        raise NoiseKeyError("no noise key configured (noise_key_file / DPC_NOISE_KEY_FILE / "
                            "--key-file)")
    return read_key(path, key_format or settings.noise_key_format)
