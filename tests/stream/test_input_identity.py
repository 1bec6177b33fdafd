"""An input topic deleted and recreated under the same name restarts its
offsets at 0; its records must be counted, not taken for duplicates of the old topic's.
Timeline batches name the input topic's identity (its topic id) and the operator's
duplicate filter keys on it. Pure: no Kafka (ingest's look-up is a function here)."""

from __future__ import annotations

from processor.stream.kafka.ingest import InputIdentity, InputRecord, route
from processor.stream.model.operator import Operator
from processor.stream.model.records import Event, decode_timeline, encode_batch
from processor.stream.model.state import DictStore
from tests.stream.helpers import apply_now
from tests.stream.test_operator import KEY, TICK, StepFactory, settings


def applied(batches: list[bytes]) -> tuple[int, int]:
    """(events applied, duplicates dropped) over `batches` applied in order."""
    op = Operator(settings({"a": 0}), KEY, factory=StepFactory())
    store = DictStore()
    got = dropped = 0
    for offset, record in enumerate(batches):
        out = apply_now(op, store, 0, offset, record)
        got += out.metrics["events_applied"]
        dropped += out.metrics["duplicates_dropped"]
    return got, dropped


def events(offsets: range) -> list[Event]:
    return [Event("a", 5 * TICK, 65536, 0, o) for o in offsets]


def test_a_recreated_topic_is_a_new_source() -> None:
    """Ten events of topic id A, then ten of topic id B at the same offsets: all twenty
    count. Control: batches that name no identity drop the second ten."""
    assert applied([encode_batch(events(range(10)), "A"),
                    encode_batch(events(range(10)), "B")]) == (20, 0)
    assert applied([encode_batch(events(range(10))),
                    encode_batch(events(range(10)))]) == (10, 10)


def test_re_reads_of_one_topic_stay_duplicates_across_the_upgrade() -> None:
    """Records written before batches named an identity, re-sent after (a crash across
    the upgrade): the unnamed entry becomes the named one, the re-sent events are
    dropped, and the ones past it count. Then a re-read under the same id: dropped."""
    assert applied([encode_batch(events(range(10))),
                    encode_batch(events(range(15)), "A"),
                    encode_batch(events(range(12, 15)), "A")]) == (15, 13)


def test_ingest_looks_the_identity_up_again_when_offsets_go_back() -> None:
    """Offsets that go back trigger a look-up: the same id (a re-read after a
    rebalance) changes nothing; a new id (the topic recreated) is counted once and named
    by the next batches. A look-up that fails leaves batches unnamed, as before."""
    ids = iter(["A", "A", "B"])
    ident = InputIdentity(lambda: next(ids))
    ident.refresh()
    rec = [InputRecord(0, o, b"{}") for o in range(5, 8)]
    ident.observe(rec)
    assert (ident.source, ident.recreated) == ("A", 0)
    ident.observe(rec)  # offsets 5..7 again: a re-read
    assert (ident.source, ident.recreated) == ("A", 0)
    ident.observe([InputRecord(0, 0, b"{}")])  # back to 0: the topic is new
    assert (ident.source, ident.recreated) == ("B", 1)

    def refused() -> str:
        raise TimeoutError

    none = InputIdentity(refused)
    none.refresh()
    assert none.source == ""
    s = settings({"a": 0})
    raw = b'{"counter":"a","ts":1000,"value":1}'
    for source, want in (("B", "B"), ("", "")):
        routed = route([InputRecord(0, 0, raw)], s, 10**13, source=source)
        [(_, data)] = routed.timeline
        batch = decode_timeline(data)
        assert getattr(batch, "source", None) == want
