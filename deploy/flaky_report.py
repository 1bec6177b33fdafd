"""Which tests failed in repeated runs: reads the JUnit XML reports of `deploy/test.sh
--repeat N` and prints each test that failed (or errored) in at least one run, with how
many runs, then a one-line summary. Exit 0 when every run passed every test it ran, 1 when
a test failed in any run or a report is missing or ran no test, 2 on bad arguments.

    python deploy/flaky_report.py REPORT.xml [REPORT.xml ...]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def outcomes(report: Path) -> tuple[int, list[str]]:
    """(tests run, ids of the tests that failed or errored) of one JUnit XML report."""
    root = ET.parse(report).getroot()
    ran, failed = 0, []
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            cls = case.get("classname", "").replace(".", "/")
            failed.append(f"{cls}.py::{case.get('name', '?')}")
    return ran, failed


def main(argv: list[str]) -> int:
    if not argv:
        print("error: give the JUnit XML reports of the runs", file=sys.stderr)
        return 2
    counts: Counter[str] = Counter()
    bad_runs = 0
    for name in argv:
        path = Path(name)
        try:
            ran, failed = outcomes(path)
        except (OSError, ET.ParseError) as exc:
            print(f"{path.name}: no readable report ({type(exc).__name__}): the run "
                  "did not finish", file=sys.stderr)
            bad_runs += 1
            continue
        if ran == 0:
            print(f"{path.name}: ran no test", file=sys.stderr)
            bad_runs += 1
        counts.update(set(failed))
    runs = len(argv)
    for test, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"failed in {n} of {runs} runs: {test}")
    print(f"flaky report: {len(counts)} test(s) failed at least once in {runs} run(s)"
          + (f"; {bad_runs} run(s) without a usable report" if bad_runs else ""))
    return 1 if counts or bad_runs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
