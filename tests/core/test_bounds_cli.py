"""`python -m processor count --with-bound`: each line carries the bound of its tick."""

from __future__ import annotations

import io

import orjson

from processor.commands.count import cmd_count
from processor.core.bounds import simecc_bound
from processor.core.cc import DEFAULT_BASE


def _run(argv: list[str], text: str) -> tuple[int, list[dict[str, float]], str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_count(argv, io.StringIO(text), out, err)
    return rc, [orjson.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_with_bound_adds_the_bound_of_each_tick() -> None:
    argv = ["--mechanism", "simecc", "--epsilon", "10", "--delta", "1e-5", "--seed", "3",
            "--with-bound"]
    rc, rows, _ = _run(argv, "1\n_*400\n1\n")
    assert rc == 0 and len(rows) == 402
    for row in rows:
        assert set(row) == {"t", "y", "bound"}
        assert row["bound"] == simecc_bound(10.0, 1e-5, 0.05, int(row["t"]), DEFAULT_BASE)
    # --changes: ticks reported from inside the skip get their own tick's bound
    rc, rows, _ = _run([*argv, "--changes", "--beta", "0.01"], "1\n_*400\n1\n")
    assert rc == 0
    assert all(r["bound"] == simecc_bound(10.0, 1e-5, 0.01, int(r["t"]), DEFAULT_BASE)
               for r in rows)


def test_without_the_flag_lines_are_unchanged_and_beta_is_checked() -> None:
    argv = ["--mechanism", "simecc", "--epsilon", "10", "--delta", "1e-5", "--seed", "3"]
    rc, rows, _ = _run(argv, "1\n1\n")
    assert rc == 0 and all(set(r) == {"t", "y"} for r in rows)
    rc, _, err = _run([*argv, "--with-bound", "--beta", "1.5"], "1\n")
    assert rc == 2 and err.startswith("error: ") and "beta" in err
