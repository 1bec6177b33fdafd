"""Every topic name of a deployment, in one place: the five configured topics
(`topic_name`), the units topic of privacy_unit = "user", the changelogs Faust names after
the state tables, and the retention each topic is created with."""

from __future__ import annotations

from typing import Final

from processor.stream.kafka.kafka_io import TopicRole
from processor.stream.model.config import Settings

#: The operator's state table (its changelog: `changelog_topic`).
STATE_TABLE: Final = "dpc-state"
#: The bounding stage's state table (its changelog: `units_changelog_topic`).
UNITS_TABLE: Final = "units-state"


def topic_name(settings: Settings, which: TopicRole) -> str:
    """The configured name of topic `which` (input, timeline, counts, ledger, deadletter)."""
    t = settings.topics
    names: dict[str, str] = {"input": t.input, "timeline": t.timeline, "counts": t.counts,
                             "ledger": t.ledger, "deadletter": t.deadletter}
    return names[which]


def table_changelog(settings: Settings, table: str) -> str:
    """The name Faust gives the changelog topic of the app's table `table`."""
    return f"{settings.app_id}-{table}-changelog"


def changelog_topic(settings: Settings) -> str:
    """The name Faust gives the state table's changelog topic."""
    return table_changelog(settings, STATE_TABLE)


def units_topic(settings: Settings) -> str:
    """The units topic: the timeline's name + "-units" (internal, like the timeline; no
    setting of its own, so that event-mode configurations are unchanged)."""
    return f"{settings.topics.timeline}-units"


def units_changelog_topic(settings: Settings) -> str:
    """The name Faust gives the units table's changelog topic."""
    return table_changelog(settings, UNITS_TABLE)


def state_tables(settings: Settings) -> dict[str, str]:
    """Table name -> changelog topic of every state table a worker of `settings` keeps:
    the operator's, and in user mode the bounding stage's units table (the worker's
    stages are built to match; the start loads these before the stages exist)."""
    tables = {STATE_TABLE: changelog_topic(settings)}
    if settings.privacy_unit == "user":
        tables[UNITS_TABLE] = units_changelog_topic(settings)
    return tables


def retention_required(settings: Settings) -> dict[str, int]:
    """topic -> the retention.ms it is created with (-1: forever). The ledger is always
    kept forever: it records every (epsilon, delta) spent, and a restarted worker refuses
    to re-create a counter it announced (operator.AnnouncedCounterError), which it can
    only while the entry is there."""
    out = {topic_name(settings, "timeline"): settings.timeline_retention_ms,
           topic_name(settings, "counts"): settings.counts_retention_ms,
           topic_name(settings, "deadletter"): settings.deadletter_retention_ms,
           topic_name(settings, "ledger"): -1}
    if settings.privacy_unit == "user":
        out[units_topic(settings)] = settings.timeline_retention_ms
    return out
