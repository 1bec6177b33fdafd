"""Logging setup of every entry point of the stream path (worker, replay, ingest).

`configure_logging(loglevel, log_format)` is the one place that decides what reaches the
logs and how a line looks: "text" (one human-readable line) or "json" (one JSON object per
line: ts, level, logger, msg, exc when there is a traceback, and `fields` when the record
carries structured fields; for log shippers). Structured fields are given as
`log.info("metrics", extra={"fields": {"events_applied": 12, ...}})`: the JSON line has
them as an object (`"fields": {"events_applied": 12, ...}`), the text line appends them as
`k=v` after the message. The worker's periodic `metrics %s` line with its `k=v ...`
summary is recognised too and its counts become `fields` in JSON (msg "metrics"). The
processor's own loggers follow `loglevel`; the client libraries' loggers never go below
the floors in CLIENT_LOG_FLOORS, whatever `loglevel` says, because below them they print
secrets and private input (read in the installed packages):

- aiokafka at DEBUG logs every request struct (`conn.py`: "Request to %s:%d %d: %s"),
  among them `SaslAuthenticateRequest(sasl_auth_bytes=b'user\\x00user\\x00<password>')` under
  SASL/PLAIN and the produce requests with their records, and each record it sends
  (`producer.py`: "Sending (key=%s value=%s) to %s"). At INFO it logs group, metadata and
  authentication events ("Authenticated as <username> via <mechanism>"): no password,
  no record.
- faust at DEBUG logs values agents yield (`agents/agent.py`: "%r yielded: %r") and
  changelog recovery per message; mode (Faust's service framework) logs service internals
  at DEBUG. kafka (kafka-python, should a dependency bring it) has aiokafka's DEBUG lines.
- librdkafka (confluent_kafka: the ingest stage, topic administration, replay) prints to
  stderr by itself, not through Python logging, and only what its `debug` contexts enable:
  no configuration of the processor sets `debug`, so it prints errors and warnings about
  connections, never records or credentials. Should a client ever be given a Python
  `logger`, the names "confluent_kafka" and "rdkafka" are clamped here too.

Two layers, so that neither a logger a library configures later nor a child logger with a
level of its own gets through: each family's logger gets the floor as its level (cheap: a
DEBUG call returns before formatting), and a filter on the root handlers drops any record
of those families below its floor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import orjson

#: Logger family -> the lowest level it may emit at (see the module docstring for why).
CLIENT_LOG_FLOORS: Mapping[str, int] = MappingProxyType({
    "aiokafka": logging.INFO,
    "kafka": logging.INFO,
    "faust": logging.INFO,
    "mode": logging.INFO,
    "confluent_kafka": logging.INFO,
    "rdkafka": logging.INFO,
})

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: The values of `--log-format`.
LOG_FORMATS = ("text", "json")


#: The LogRecord attribute that carries structured fields (`extra={FIELDS: {...}}`).
FIELDS = "fields"
#: The worker's metrics line as the worker writes it: "metrics %s" % "k=v k=v ...".
_METRICS_MSG = "metrics %s"


def _key_values(text: str) -> dict[str, int | str] | None:
    """`k=v k=v ...` as a dict (integers as ints); None unless every token is k=v."""
    out: dict[str, int | str] = {}
    for token in text.split():
        key, sep, val = token.partition("=")
        if not sep or not key:
            return None
        try:
            out[key] = int(val)
        except ValueError:
            out[key] = val
    return out


def record_fields(record: logging.LogRecord) -> tuple[str, dict[str, Any]] | None:
    """(message, fields) of a record with structured fields: given in `extra={"fields":
    {...}}`, or the worker's `metrics %s` summary line; None for any other record."""
    given = getattr(record, FIELDS, None)
    if isinstance(given, Mapping):
        return record.getMessage(), dict(given)
    if (record.msg == _METRICS_MSG and isinstance(record.args, tuple)
            and len(record.args) == 1 and isinstance(record.args[0], str)):
        parsed = _key_values(record.args[0])
        if parsed is not None:
            return "metrics", parsed
    return None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601, milliseconds), level, logger, msg,
    exc (the formatted traceback) when the record carries one, and fields (an object) when
    it carries structured fields (`record_fields`)."""

    def format(self, record: logging.LogRecord) -> str:
        structured = record_fields(record)
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage() if structured is None else structured[0],
        }
        if structured is not None:
            line[FIELDS] = structured[1]
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


class TextFormatter(logging.Formatter):
    """LOG_FORMAT, with the structured fields given in `extra={"fields": ...}` appended as
    `k=v` (sorted), so a line written for JSON reads the same as before in text."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        given = getattr(record, FIELDS, None)
        if isinstance(given, Mapping) and given:
            text += " " + " ".join(f"{k}={v}" for k, v in sorted(given.items()))
        return text


def make_formatter(log_format: str) -> logging.Formatter:
    """The formatter of `--log-format` ("text" or "json"); ValueError for anything else."""
    if log_format == "text":
        return TextFormatter(LOG_FORMAT)
    if log_format == "json":
        return JsonFormatter()
    raise ValueError(f"unknown log format {log_format!r} (expected one of {LOG_FORMATS})")


def client_floor(name: str) -> int | None:
    """The floor of the family logger `name` belongs to, or None (not a client logger)."""
    family = name.split(".", 1)[0]
    return CLIENT_LOG_FLOORS.get(family)


class ClientLogFloor(logging.Filter):
    """Drops records of the client families below their floor (a handler filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        floor = client_floor(record.name)
        return floor is None or record.levelno >= floor


def parse_level(loglevel: str | int) -> int:
    """`--loglevel` (debug, info, warning, error, critical, or a number) as a level."""
    if isinstance(loglevel, int):
        return loglevel
    level = logging.getLevelName(loglevel.strip().upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {loglevel!r}")
    return level


class FaustSensorNoise(logging.Filter):
    """Drops Faust's "Missing sensor state for rebalance" warnings: Faust logs one at a
    first assignment when its sensor hook for the rebalance start has not run yet (no
    sensors are configured here); it says nothing about the worker, and a warning at every
    start teaches operators to ignore warnings. A handler filter: Faust logs it through
    the app's logger, which is the module of the App subclass (processor.stream.app for
    the worker), not faust.app.base."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Missing sensor state for rebalance" not in record.getMessage()


def configure_logging(loglevel: str | int = "warning", log_format: str = "text") -> int:
    """Set up the root logger at `loglevel` (a stderr handler if it has none) with the
    `log_format` formatter on its handlers, and clamp the client libraries' loggers to
    their floors; returns the level. Idempotent."""
    level = parse_level(loglevel)
    formatter = make_formatter(log_format)
    root = logging.getLogger()
    if not root.handlers:  # basicConfig's handler, with our formatter (text or json)
        stderr = logging.StreamHandler()
        stderr.setFormatter(formatter)
        root.addHandler(stderr)
    root.setLevel(level)
    if log_format != "text":  # other handlers keep their text format; json is for all
        for handler in root.handlers:
            handler.setFormatter(formatter)
    clamp_client_loggers(level)
    for handler in root.handlers:
        _filter_once(handler, FaustSensorNoise)
    return level


def _filter_once(handler: logging.Handler, kind: type[logging.Filter]) -> None:
    """Put a `kind` filter on `handler` unless it has one (configure_logging may run more
    than once)."""
    if not any(isinstance(f, kind) for f in handler.filters):
        handler.addFilter(kind())


def clamp_client_loggers(level: int) -> None:
    """Give each client family logger max(level, floor), lift any child logger configured
    below its floor, and put the floor filter on every root handler."""
    for family, floor in CLIENT_LOG_FLOORS.items():
        logging.getLogger(family).setLevel(max(level, floor))
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        child_floor = client_floor(name)
        if (child_floor is not None and isinstance(logger, logging.Logger)
                and logger.level != logging.NOTSET and logger.level < child_floor):
            logger.setLevel(child_floor)
    for handler in logging.getLogger().handlers:
        _filter_once(handler, ClientLogFloor)
