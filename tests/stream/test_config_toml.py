"""config.toml_loads: the [counters] table read by its fast path gives what tomllib gives,
and whatever the fast path does not cover (or TOML refuses) goes to tomllib whole."""

from __future__ import annotations

import tomllib

import pytest

from processor.stream.model.config import toml_loads

PLAIN = ('app_id = "a"\ntick_ms = 1000\n[topics]\ninput = "in"\n[counters]\n'
         '"c1" = 0\n"a.b:c/d@e+f-g_h" = 2000\nbare_key-1 = 3000\n[families]\n'
         'f = { open = true, start = 0, selection_delta = 1e-9 }\n')

SAME = [
    PLAIN,
    PLAIN.replace("[families]", "[unit]").split("f = {")[0],   # counters before [unit]
    "[counters]\n\"x\" = 5\n",                                 # the table first
    "[counters]\n\"x\" = 5",                                   # no final newline
    "[counters]\n",                                            # empty
    'app_id = "a"\n[counters]\n"x" = 1\n\n"y" = 2\n',          # a blank line: tomllib
    '[counters]\n"x" = 1 # comment\n',                         # a comment: tomllib
    '[counters]\n"x\\u0041" = 1\n',                            # an escape: tomllib
    "[counters]\n'x' = 1\n",                                   # a literal string: tomllib
    '[counters]\n"x" = 0x10\n"y" = 1_000\n',                   # other integers: tomllib
    '[counters]\n"é" = 1\n',                                   # non-ASCII: tomllib
    'a = """\n[counters]\n"x" = 1\n"""\n[counters]\n"y" = 2\n',  # a multi-line string
    '[counters]\n"x" = 1\n[counters.sub]\n"y" = 2\n',          # a sub-table: tomllib
]

REFUSED = [
    '[counters]\n"x" = 1\n"x" = 2\n',                          # a duplicate name
    '[counters]\n"x" = 1\n[counters]\n"y" = 2\n',              # the table twice
    'counters.x = 1\n[counters]\n"y" = 2\n',                   # a dotted key before
    '[counters]\n"x" = 1\n"y" = \n',                           # a broken line
    '[counters]\n"x" = 01\n',                                  # a leading zero
]


@pytest.mark.parametrize("text", SAME)
def test_same_as_tomllib(text: str) -> None:
    assert toml_loads(text) == tomllib.loads(text)


@pytest.mark.parametrize("text", REFUSED)
def test_refused_as_tomllib(text: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(text)
    with pytest.raises(tomllib.TOMLDecodeError):
        toml_loads(text)


def test_plain_table_skips_tomllib_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a plain table of 1,000 counters reaches tomllib without them."""
    text = 'app_id = "a"\n[counters]\n' + "".join(f'"c{i}" = {i}\n' for i in range(1000))
    seen: list[str] = []
    real = tomllib.loads

    def loads(t: str) -> dict[str, object]:
        seen.append(t)
        return real(t)

    monkeypatch.setattr(tomllib, "loads", loads)
    got = toml_loads(text)
    assert got == real(text)
    assert len(seen) == 1 and '"c999"' not in seen[0]
