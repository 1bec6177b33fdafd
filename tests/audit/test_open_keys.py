"""The open-key audit (processor/audit/open_keys.py via `audit --open-keys`): the gate of
processor/core/selection.py passes, each broken control FAILS and is caught by the check
docs/open-keys.md names. Fixed seed 0; the verdict's false-alarm rate is at most --alpha
(0.05) for a correct gate, and the controls fail by wide margins (the per-tick gate admits
about half the keys without events where at most a third is allowed)."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

from processor.commands.audit import main_audit

ROOT = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *extra: str,
         mechanism: str = "simecc") -> tuple[int, dict[str, object]]:
    rc = main_audit(["--mechanism", mechanism, "--open-keys", "--calibration", "tight",
                     "--json", *extra])
    out = capsys.readouterr().out
    return rc, orjson.loads(out) if out else {}


def _failed(rep: dict[str, object]) -> set[str]:
    confs = rep["configurations"]
    assert isinstance(confs, list)
    return {c["name"] for conf in confs for c in conf["checks"] if not c["passed"]}


@pytest.mark.parametrize("mechanism", ["simecc", "ecc"])
def test_the_real_gate_passes(capsys: pytest.CaptureFixture[str], mechanism: str) -> None:
    rc, rep = _run(capsys, mechanism=mechanism)
    assert rc == 0 and rep["passed"] is True and not _failed(rep)


@pytest.mark.parametrize(("control", "caught"), [
    ("per-tick", "time-uniform"), ("ignores-k", "time-uniform"),
    ("leaves-out", "admission release"), ("noiseless", "noisy at admission")])
def test_each_control_fails(capsys: pytest.CaptureFixture[str], control: str,
                            caught: str) -> None:
    rc, rep = _run(capsys, "--open-keys-control", control)
    assert rc == 1 and rep["passed"] is False and caught in _failed(rep)


def test_other_mechanisms_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_audit(["--mechanism", "gaussiancc", "--open-keys"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_the_audit_does_not_import_the_gate() -> None:
    src = (ROOT / "processor/audit/open_keys.py").read_text()
    mods = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    assert mods and "processor.core.selection" not in mods
    assert all(not (m or "").endswith("selection") for m in mods)
