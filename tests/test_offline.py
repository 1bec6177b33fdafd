"""The offline tick-file path: parsing, error lines, and expansion of _*N runs."""

from __future__ import annotations

import io
from typing import Self

import orjson
import pytest

from processor.commands.main import main
from processor.commands.offline import (
    Skip,
    TickSyntaxError,
    parse_tick_line,
    parse_ticks,
    run_counter,
)
from processor.core.api import Counter, check_skip
from processor.core.grid import from_units, to_units
from processor.core.rng import NoiseKey
from processor.keyfile import read_key


class ExactCounter(Counter):
    """A non-private reference counter (y_t = s_t) whose skip jumps; for testing the driver."""

    mechanism = "exact-test"
    edit_private = False

    def __init__(self) -> None:
        self._t = 0
        self._s = 0

    @property
    def t(self) -> int:
        return self._t

    @property
    def y(self) -> float:
        return from_units(self._s)

    def update(self, x: float | None) -> float:
        u = to_units(x)
        self._t += 1
        self._s += u
        return self.y

    def skip(self, n: int) -> list[tuple[int, float]]:
        self._t += check_skip(n)
        return []

    def to_bytes(self) -> bytes:
        return orjson.dumps([self._t, self._s])

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self:
        c = cls()
        c._t, c._s = orjson.loads(data)
        return c

    def error_bound(self, beta: float = 0.05) -> float:
        return 0.0


def test_parse_lines() -> None:
    assert parse_tick_line("1", 1) == 1.0
    assert parse_tick_line(" 0.25 \n", 1) == 0.25
    assert parse_tick_line("_", 1) is None
    assert parse_tick_line("_*7", 1) == Skip(7)


@pytest.mark.parametrize(
    "line, fragment",
    [("", "empty"), ("abc", "not a number"), ("1.5", "[0, 1]"), ("-0.1", "[0, 1]"),
     ("nan", "finite"), ("inf", "finite"), ("_*x", "whole number"), ("_*-3", "whole number")],
)
def test_bad_lines_name_the_line(line: str, fragment: str) -> None:
    with pytest.raises(TickSyntaxError) as info:
        list(parse_ticks(["1", "_", line]))
    assert info.value.line_no == 3
    assert fragment in str(info.value)


def test_run_counter_expands_skips_and_changes_only() -> None:
    items = list(parse_ticks(["1", "_*3", "0.5", "_", "_*2"]))
    every = list(run_counter(ExactCounter(), items))
    assert every == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.5), (6, 1.5), (7, 1.5), (8, 1.5)]
    changes = list(run_counter(ExactCounter(), items, changes_only=True))
    assert changes == [(1, 1.0), (5, 1.5), (8, 1.5)]


def test_cli_count_reports_bad_line(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from processor.core import registry

    monkeypatch.setattr(registry, "make", lambda *a, **k: ExactCounter())
    monkeypatch.setattr("sys.stdin", io.StringIO("1\n_\n2\n"))
    rc = main(["count", "--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6", "--seed", "1"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "line 3" in err
    assert [orjson.loads(x) for x in out.splitlines()] == [{"t": 1, "y": 1.0}, {"t": 2, "y": 1.0}]


def test_cli_requires_a_key() -> None:
    with pytest.raises(SystemExit):
        main(["count", "--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6"])


def test_keygen_writes_private_file(tmp_path: pytest.TempPathFactory) -> None:
    import os
    import stat

    path = os.path.join(str(tmp_path), "key")
    assert main(["keygen", path]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = read_key(path)
    assert repr(key) == "NoiseKey(<secret>)"
    assert main(["keygen", path]) == 2  # never overwrites a key by accident


def test_cli_count_offers_exactly_the_registered_mechanisms(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The choices come from the registry: every registered mechanism runs, nothing else."""
    from processor.commands.count import count_parser
    from processor.core import registry

    action = next(a for a in count_parser()._actions if a.dest == "mechanism")
    assert list(action.choices or ()) == registry.names()
    for name in registry.names():
        params = ["--horizon", "8"] if name == "partitioncc" else []
        rc = main(["count", "--mechanism", name, "--epsilon", "1", "--delta", "1e-6",
                   "--seed", "1", "--input", "/dev/null", *params])
        assert rc == 0, (name, capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["count", "--mechanism", "not-a-mechanism", "--epsilon", "1", "--delta", "1e-6",
              "--seed", "1"])
    assert "invalid choice" in capsys.readouterr().err
