"""Run a core mechanism over a file of ticks: the offline path that auditors and tests use.

Input: one tick per line; a number in [0, 1], `_` for ⊥, or `_*N` for N consecutive ⊥.
Output: one JSON object per tick, {"t": t, "y": y}; with `changes_only`, only the ticks
where y changes plus the last tick, so a long empty run costs nothing to print.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from processor.core.api import Counter
from processor.errors import ProcessorError

Tick = float | None


@dataclass(frozen=True)
class Skip:
    """A run of n consecutive ⊥ ticks."""

    n: int


class TickSyntaxError(ProcessorError, ValueError):
    """A line of the tick file that is not a number in [0, 1], `_` or `_*N`."""

    def __init__(self, line_no: int, reason: str) -> None:
        self.line_no = line_no
        self.reason = reason
        super().__init__(f"line {line_no}: {reason}")


def parse_tick_line(line: str, line_no: int) -> Tick | Skip:
    text = line.strip()
    if not text:
        raise TickSyntaxError(line_no, "empty line (write _ for a tick with no event)")
    if text == "_":
        return None
    if text.startswith("_*"):
        count = text[2:]
        if not count.isdigit():
            raise TickSyntaxError(line_no, f"expected _*N with N a whole number, got {text[:40]!r}")
        return Skip(int(count))
    try:
        value = float(text)
    except ValueError:
        raise TickSyntaxError(line_no, f"not a number, _ or _*N: {text[:40]!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise TickSyntaxError(line_no, f"value must be finite, got {text[:40]!r}")
    if not 0.0 <= value <= 1.0:
        raise TickSyntaxError(line_no, f"value must be in [0, 1], got {text[:40]!r}")
    return value


def parse_ticks(lines: Iterable[str]) -> Iterator[Tick | Skip]:
    for i, line in enumerate(lines, start=1):
        yield parse_tick_line(line, i)


def run_counter(
    counter: Counter, items: Iterable[Tick | Skip], *, changes_only: bool = False
) -> Iterator[tuple[int, float]]:
    """Feed ticks to a counter; yield (t, y) for every tick, or only for changes and the last."""
    last_emitted_t = counter.t
    prev_y = counter.y
    for item in items:
        if isinstance(item, Skip):
            if item.n == 0:
                continue
            start_t = counter.t
            changes = counter.skip(item.n)
            if changes_only:
                for t, y in changes:
                    yield t, y
                    last_emitted_t = t
            else:
                y = prev_y
                ci = 0
                for t in range(start_t + 1, start_t + item.n + 1):
                    if ci < len(changes) and changes[ci][0] == t:
                        y = changes[ci][1]
                        ci += 1
                    yield t, y
                last_emitted_t = counter.t
            prev_y = counter.y
        else:
            y = counter.update(item)
            if not changes_only or y != prev_y:
                yield counter.t, y
                last_emitted_t = counter.t
            prev_y = y
    if changes_only and counter.t > last_emitted_t:
        yield counter.t, counter.y
