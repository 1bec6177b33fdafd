#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine: set everything up (venv,
# packages, Kafka jars), start a local broker, the processor and a bursty demo producer,
# and print the private counts as they are released. Extra arguments go to the demo, e.g.
#   bash deploy/demo.sh --seconds 120 --mechanism simecc
# KAFKA_BOOTSTRAP_SERVERS set: that cluster is used instead of a local broker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash deploy/setup.sh >&2
exec .venv/bin/python -m processor demo "$@"
