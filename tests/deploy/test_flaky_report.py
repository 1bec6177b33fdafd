"""deploy/flaky_report.py, the summary of `deploy/test.sh --repeat N`: a test that failed
in one run of three is named with its count, clean runs pass, and a run that left no
report or ran no test fails the hunt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "flaky_report.py"


def _report(path: Path, cases: dict[str, str]) -> Path:
    """A JUnit XML report as pytest writes it; outcome "pass", "fail", "error", "skip"."""
    body = []
    for name, outcome in cases.items():
        inner = {"pass": "", "fail": "<failure message='x'/>", "error": "<error message='x'/>",
                 "skip": "<skipped message='x'/>"}[outcome]
        body.append(f"<testcase classname='tests.stream.test_crash' name='{name}'>"
                    f"{inner}</testcase>")
    path.write_text("<testsuites><testsuite name='pytest'>" + "".join(body)
                    + "</testsuite></testsuites>")
    return path


def _run(*reports: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, reports)],
                          capture_output=True, text=True, check=False)


def test_a_test_failing_once_in_three_runs_is_named(tmp_path: Path) -> None:
    runs = [_report(tmp_path / f"run-{i}.xml",
                    {"test_failover": "fail" if i == 2 else "pass", "test_kill": "pass",
                     "test_skip": "skip"}) for i in range(1, 4)]
    runs.append(_report(tmp_path / "run-4.xml", {"test_failover": "pass",
                                                 "test_kill": "error"}))
    done = _run(*runs)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "failed in 1 of 4 runs: tests/stream/test_crash.py::test_failover",
        "failed in 1 of 4 runs: tests/stream/test_crash.py::test_kill"]
    assert "2 test(s) failed at least once in 4 run(s)" in lines[-1]


def test_clean_runs_pass(tmp_path: Path) -> None:
    runs = [_report(tmp_path / f"run-{i}.xml", {"test_failover": "pass"}) for i in (1, 2)]
    done = _run(*runs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 test(s) failed at least once in 2 run(s)" in done.stdout


def test_a_run_without_a_report_or_without_tests_fails(tmp_path: Path) -> None:
    good = _report(tmp_path / "run-1.xml", {"test_failover": "pass"})
    empty = _report(tmp_path / "run-2.xml", {"test_skip": "skip"})
    assert _run(good, empty).returncode == 1
    assert _run(good, tmp_path / "run-3.xml").returncode == 1
    assert _run().returncode == 2
