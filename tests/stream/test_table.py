"""table.ChangelogTracker: where this process's own changelog writes land tells whether
anything else wrote between them (a worker that lost the partition without noticing).
Pure: the delivery reports are calls here."""

from __future__ import annotations

from processor.stream.table import ChangelogTracker


def test_back_to_back_writes_move_the_read_point_a_foreign_one_stops_it() -> None:
    """Loaded after reading through offset 9: own writes at 10, 11, 12 keep it clean (the
    database holds everything through 12); a write landing at 14 means something else
    wrote 13: a gap is reported once, and the read point stays unknown until the
    partition is loaded again, however the writes go on. Control: an untracked
    partition reports nothing."""
    t = ChangelogTracker()
    t.begin(0, 9)
    for offset in (10, 11, 12):
        t.delivered(0, offset)
    assert t.read_through(0) == 12 and t.take_gaps() == set()
    t.delivered(0, 14)
    assert t.take_gaps() == {0} and t.read_through(0) is None
    t.delivered(0, 15)  # back to back again: no new gap, still not clean
    assert t.take_gaps() == set() and t.read_through(0) is None
    t.delivered(0, 20)  # another foreign write in between: another gap
    assert t.take_gaps() == {0}
    t.begin(0, 20)
    t.delivered(0, 21)
    assert t.read_through(0) == 21
    t.delivered(3, 5)
    assert t.take_gaps() == set() and not t.tracks(3)


def test_an_empty_changelog_expects_offset_zero() -> None:
    t = ChangelogTracker()
    t.begin(1, None)
    t.delivered(1, 0)
    assert t.read_through(1) == 0
    t.end(1)
    assert not t.tracks(1) and t.read_through(1) is None
