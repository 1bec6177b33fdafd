#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine: set everything up (venv,
# packages, Kafka jars), use the local broker of `python deploy/kafka.py start` (started in
# the background if none runs; it keeps running after the demo), start the processor, a
# bursty demo producer and the live view (its URL is printed: open it in a browser), and
# print the private counts as they are released. Ctrl-C stops the demo cleanly; the topics
# and the run directory are kept, and the demo prints how to look at them again, audit them
# and delete them. Extra arguments go to the demo, e.g.
#   bash deploy/demo.sh --seconds 120 --mechanism simecc
#   bash deploy/demo.sh --cleanup          # delete the topics and the run directory at exit
# KAFKA_BOOTSTRAP_SERVERS set: that cluster is used instead of a local broker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The headless browser of setup's step 4 is for the view's tests; the demo's reader is you.
SETUP_BROWSER="${SETUP_BROWSER:-0}" bash deploy/setup.sh >&2
exec .venv/bin/python -m processor demo "$@"
