#!/usr/bin/env python3
"""The local Kafka broker's command line: ``python deploy/kafka.py fetch|start|stop|...``.

Commands: fetch, start, start-cluster, stop, status (``--help`` describes each).

A thin wrapper kept where deploy/setup.sh, the README and the tests call it; the logic
(and ``LocalKafka``, its Python API) is ``processor.devtools.local_kafka``. The checkout's
root is put on ``sys.path`` first, so this runs with any Python 3.11, before or without the
venv: fetching needs only the standard library.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.devtools.local_kafka import main

if __name__ == "__main__":
    sys.exit(main())
