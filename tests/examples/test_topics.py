"""The retention part of the downstream contract (docs/downstream.md): the settings'
checks, the topics as ensure_topics creates them, and what it does with topics that
existed before (a ledger that would lose entries is refused, anything else shorter than
required is a warning)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from processor.stream.kafka import kafka_io
from processor.stream.model.config import ConfigError, Settings, with_overrides

BASE = with_overrides(Settings(), counters={"a": 0})
WEEK = 604_800_000


def test_retention_defaults_and_checks() -> None:
    """Defaults: timeline and private counts forever, dead letters a week. Each bad value
    names its field; the last line of each pair is the control that passes."""
    assert (BASE.timeline_retention_ms, BASE.counts_retention_ms,
            BASE.deadletter_retention_ms) == (-1, -1, WEEK)
    for field, bad, good in (
            ("timeline_retention_ms", {"timeline_retention_ms": WEEK - 1},
             {"timeline_retention_ms": WEEK, "counts_retention_ms": WEEK}),
            ("counts_retention_ms", {"counts_retention_ms": 30 * WEEK},
             {"counts_retention_ms": -1, "timeline_retention_ms": 30 * WEEK}),
            ("deadletter_retention_ms", {"deadletter_retention_ms": 0},
             {"deadletter_retention_ms": 1}),
            ("deadletter_retention_ms", {"deadletter_retention_ms": -2},
             {"deadletter_retention_ms": -1})):
        with pytest.raises(ConfigError) as err:
            with_overrides(BASE, **bad)
        assert err.value.field == field
        with_overrides(BASE, **good)
    # A finite timeline with the private counts kept as long: allowed.
    with_overrides(BASE, timeline_retention_ms=2 * WEEK, counts_retention_ms=2 * WEEK)


def _configs(conf: dict[str, str], topics: Any) -> dict[str, dict[str, str]]:
    return kafka_io.topic_configs(conf, [topics.timeline, topics.counts, topics.deadletter,
                                         topics.ledger])


def test_topics_are_created_with_the_contracts_retention(
        deployment_factory: Callable[..., Any]) -> None:
    d = deployment_factory({"a": 0}, name="ret", deadletter_retention_ms=3_600_000)
    got = _configs(d.conf, d.topics)
    forever = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    assert got[d.topics.ledger] == forever
    assert got[d.topics.timeline] == forever
    assert got[d.topics.counts] == forever
    assert got[d.topics.deadletter] == dict(forever, **{"retention.ms": "3600000"})


def test_an_existing_ledger_that_would_lose_entries_is_refused(
        deployment_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    """A ledger created beforehand with a week's retention stops the start with an error
    naming the topic and the fix; a timeline created with a week's retention (less than
    the required forever) only warns. Control: the same deployment with a ledger that
    keeps everything starts, with the timeline warning only."""
    from processor.stream.worker.app import StartError, ensure_topics

    def prepared(ledger_config: dict[str, str]) -> Any:
        d = deployment_factory({"a": 0}, name="ret", create_topics=False)
        kafka_io.create_topics(d.conf, [d.topics.ledger], d.settings.partitions,
                               config=ledger_config)
        kafka_io.create_topics(d.conf, [d.topics.timeline], d.settings.partitions,
                               config={"retention.ms": str(WEEK)})
        return d

    d = prepared({"retention.ms": str(WEEK)})
    with pytest.raises(StartError) as err:
        ensure_topics(d.settings)
    msg = str(err.value)
    assert d.topics.ledger in msg and f"retention.ms={WEEK}" in msg
    assert f"kafka-configs --bootstrap-server {d.settings.bootstrap_servers} --alter" in msg

    caplog.clear()
    d = prepared({"retention.ms": "-1"})
    with caplog.at_level(logging.WARNING, logger="processor.stream.app"):
        ensure_topics(d.settings)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and d.topics.timeline in warned[0], warned
    assert f"retention.ms={WEEK}" in warned[0]
