#!/usr/bin/env bash
# The whole check, as CI runs it (.ci/run calls this): setup, lint, type check, all tests.
# Every step runs even if an earlier one failed, so one run shows every problem; the exit
# code is non-zero if any step failed. pytest's exit code 5 ("no tests collected") is a
# failure too: a run that tested nothing must not pass. Arguments go to pytest, e.g.
#   bash deploy/test.sh tests/stream -m kafka
# The flaky-test hunt: `--repeat N` runs the broker tests (-m kafka; the remaining
# arguments go to pytest as well) N times on one broker, without lint and type check,
# then prints each test that failed in at least one run with its count, and exits
# non-zero if any did:
#   bash deploy/test.sh --repeat 5
#   bash deploy/test.sh --repeat 10 tests/stream/test_crash.py
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

repeat=0
if [ "${1:-}" = "--repeat" ]; then
    repeat="${2:-}"
    if ! [[ "$repeat" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: --repeat needs a number of runs (1 or more), got '${repeat}'" >&2
        exit 2
    fi
    shift 2
fi

bash deploy/setup.sh
# The tests run the native samplers, as production does (an import error if setup did not
# install them); the reference's own tests switch them off (tests/core/test_samplers.py).
export DPC_SAMPLERS="${DPC_SAMPLERS:-native}"

failed=()
step() {
    echo "+ $*"
    local rc=0
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        if [ "$1" = ".venv/bin/pytest" ] && [ "$rc" -eq 5 ]; then
            echo "test.sh: pytest collected no tests (exit 5): counted as a failure" >&2
        fi
        failed+=("$* (exit $rc)")
    fi
}

if [ "$repeat" = 0 ]; then
    step .venv/bin/ruff check processor tests bench deploy reliability
    # strict, over the `files` of pyproject.toml's [tool.mypy] (tests and deploy/kafka.py too)
    step .venv/bin/mypy
fi
# One broker for the whole run, shared by the test processes (each test makes its own
# topics): started here unless KAFKA_BOOTSTRAP_SERVERS names a cluster already, stopped on
# exit. If it cannot start, the fixtures report why (a failure in CI, a skip elsewhere).
# PYTEST_WORKERS (default 2) test processes; 0 runs everything in this one process.
workers="${PYTEST_WORKERS:-2}"
broker_state=""
reports=""
stop_broker() {
    if [ -n "$broker_state" ]; then
        .venv/bin/python deploy/kafka.py stop --state-file "$broker_state" >/dev/null 2>&1 || true
        rm -rf "$(dirname "$broker_state")"
    fi
    [ -z "$reports" ] || rm -rf "$reports"
}
trap stop_broker EXIT
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] && [ "$workers" != 0 ]; then
    broker_state="$(mktemp -d)/kafka.json"
    if bootstrap="$(.venv/bin/python deploy/kafka.py start --state-file "$broker_state")"; then
        export KAFKA_BOOTSTRAP_SERVERS="$bootstrap"
    else
        echo "test.sh: the shared broker did not start; the broker fixtures will say why" >&2
    fi
fi
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist worksteal)

if [ "$repeat" != 0 ]; then
    reports="$(mktemp -d)"
    for i in $(seq 1 "$repeat"); do
        echo "test.sh: broker tests, run $i of $repeat"
        step .venv/bin/pytest -q "${parallel[@]}" -m kafka \
            --junitxml="$reports/run-$i.xml" "$@"
    done
    .venv/bin/python deploy/flaky_report.py "$reports"/run-*.xml
    exit $?
fi

step .venv/bin/pytest -q "${parallel[@]}" "$@"

if [ "${#failed[@]}" -ne 0 ]; then
    echo "test.sh: FAILED steps:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "test.sh: all steps passed"
