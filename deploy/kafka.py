#!/usr/bin/env python3
"""The local Kafka broker's command line: ``python deploy/kafka.py fetch|start|stop|...``.

Commands: fetch, start, start-cluster, stop, status (``--help`` describes each).

A thin wrapper kept where deploy/setup.sh, the README and the tests call it; the logic
(and ``LocalKafka``, its Python API) is ``processor.devtools.kafka``. The checkout's
root is put on ``sys.path`` first, so this runs with any Python 3.11, before or without the
venv: fetching needs only the standard library. Every other command asks the brokers for
metadata with confluent-kafka; run by an interpreter without it (the system ``python3``, as
``python deploy/kafka.py status`` usually is), the script re-executes itself with the
checkout's ``.venv/bin/python`` (created by ``bash deploy/setup.sh``) and says so on stderr.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def _reexec_in_venv(argv: list[str]) -> None:
    """Without confluent-kafka here, run this script with the venv's Python instead (it has
    it after setup); `fetch` and `--help` need only the standard library and stay."""
    if importlib.util.find_spec("confluent_kafka") is not None:
        return
    if not argv or argv[0] == "fetch" or "-h" in argv or "--help" in argv:
        return
    if not VENV_PYTHON.exists() or Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        print("kafka.py: this Python has no confluent_kafka and there is no .venv here: run "
              "`bash deploy/setup.sh` first", file=sys.stderr)
        return  # the command then reports what fails
    print(f"kafka.py: {sys.executable} has no confluent_kafka; running with {VENV_PYTHON}",
          file=sys.stderr)
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *argv])


if __name__ == "__main__":
    _reexec_in_venv(sys.argv[1:])
    sys.path.insert(0, str(ROOT))
    from processor.devtools.kafka.cli import main

    sys.exit(main())
