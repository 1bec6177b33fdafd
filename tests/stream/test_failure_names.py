"""How the worker names a failure of its operator in the log (`app.failure_name`,
`Worker.operator_failed`): the error type, and for RocksDB's errors (which rocksdict
raises as a bare Exception) the kind their text begins with, never the rest of it. A
clean stop once failed as "operator failed (Exception)" and only a traceback told that
it was RocksDB's "IO error: lock hold by current process".

Every check is exact (false-alarm rate 0). Controls: a bare Exception whose text does
not begin with a kind, another type whose text does, and a kind without its ": " are
named by their type alone; the secret in the text is in no line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from processor.stream.model.config import Settings, with_overrides
from processor.stream.worker.app import ROCKSDB_KINDS, Worker, failure_name

SECRET = "/state/c/secret-counter-name/LOCK"


@pytest.mark.parametrize("kind", ROCKSDB_KINDS)
def test_a_rocksdb_error_is_named_by_its_kind(kind: str) -> None:
    assert failure_name(Exception(f"{kind}: {SECRET}")) == f"Exception: RocksDB {kind}"


@pytest.mark.parametrize("exc", [Exception(f"secret-counter-name: {SECRET}"),
                                 ValueError(f"IO error: {SECRET}"),
                                 Exception(f"IO error {SECRET}"),
                                 Exception()],
                         ids=["other-text", "other-type", "no-colon", "empty"])
def test_control_anything_else_is_named_by_its_type(exc: Exception) -> None:
    assert failure_name(exc) == type(exc).__name__


def test_the_operator_failure_line_names_the_kind_and_nothing_of_the_text(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The production path (`Worker.operator_failed`, os._exit stubbed): one critical
    line with the kind, the path and key in the text nowhere."""
    class Exited(Exception):
        pass

    def no_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", no_exit)
    monkeypatch.setattr(logging, "shutdown", lambda: None)
    settings: Settings = with_overrides(Settings(), state_dir=str(tmp_path),
                                        counters={"x": 0})
    exc = Exception("IO error: lock hold by current process, acquire time 1 acquiring "
                    f"thread 2: {SECRET}: No locks available")
    with caplog.at_level(logging.CRITICAL, logger="processor.stream.app"), \
            pytest.raises(Exited):
        Worker.operator_failed(SimpleNamespace(settings=settings), exc)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["operator failed (Exception: RocksDB IO error); stopping the worker"]
    assert not any("secret" in line or "LOCK" in line for line in lines)
