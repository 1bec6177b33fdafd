#!/usr/bin/env bash
# One-shot setup for a fresh machine, safe to run again (it only does what is missing):
#   1. creates .venv with python3.11 if there is none;
#   2. installs the project and its dev tools into it (pip install -e '.[dev]'), pinned to
#      the exact versions of deploy/constraints.txt (bash deploy/lock.sh regenerates it), again
#      only when pyproject.toml or the constraints changed since the last install or the
#      install looks broken;
#   3. builds the native samplers (native/, a Rust crate built by maturin into the
#      dpc_native extension) and installs them into .venv, only when native/'s sources
#      changed since the last build (its own stamp) or the extension does not import;
#      installs Rust with rustup (minimal profile, pinned toolchain) into ~/.cargo if cargo
#      is missing. A failed build fails the setup: nothing falls back silently;
#   4. fetches the Apache Kafka broker jars from Maven Central (once; cached in
#      deploy/.cache/kafka-libs), the kafka-tools jar of the same version for Kafka's
#      command-line tools (deploy/.cache/kafka-tools; run them with deploy/kafka-tool.sh),
#      and the Java example subscriber's (examples/java);
#   5. installs Debian's chromium and chromium-driver (the headless browser of the live
#      view's tests, tests/view) when they are missing and apt-get is there (as root or
#      with sudo; SETUP_BROWSER=0 skips it). Without them those tests skip (fail in CI).
# Needs: python3.11, java (17) and mvn on PATH, a C linker (cc) and curl for rustup. Extra arguments go to the Maven fetch, e.g.
#   bash deploy/setup.sh -Dmaven.repo.local=/tmp/m2
# Environment: PYTHON (default python3.11), FORCE_SETUP=1 reinstalls the Python packages.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3.11}"
started=$SECONDS

if [ ! -x .venv/bin/python ]; then
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        echo "setup: $PYTHON was not found on PATH; install Python 3.11 (or set PYTHON=...)" >&2
        exit 3
    fi
    echo "setup: creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi

# The stamp records which pyproject.toml and constraints the venv was installed from, so a
# rerun skips pip.
stamp=.venv/.dp-setup-stamp
want="$(cat pyproject.toml deploy/constraints.txt | sha256sum | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
if [ "${FORCE_SETUP:-0}" = 1 ] || [ "$have" != "$want" ] \
    || ! .venv/bin/python -c "import processor, confluent_kafka, faust, pytest, mypy" 2>/dev/null; then
    echo "setup: installing the project and dev tools into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -c deploy/constraints.txt -e '.[dev]'
    echo "$want" > "$stamp"
else
    echo "setup: .venv is up to date"
fi

# The native samplers: the Python samplers stay the reference (DPC_SAMPLERS=reference
# forces them; processor/core/samplers/native.py), the extension is what production runs.
rust_toolchain=1.95.0
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: installing Rust $rust_toolchain with rustup (cargo was not found)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "$rust_toolchain"
    export PATH="$HOME/.cargo/bin:$PATH"
fi
native_stamp=.venv/.dp-native-stamp
native_want="$(cat native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src/*.rs \
    | sha256sum | cut -d' ' -f1)"
if [ "${FORCE_SETUP:-0}" = 1 ] || [ "$(cat "$native_stamp" 2>/dev/null || true)" != "$native_want" ] \
    || ! .venv/bin/python -c "import dpc_native" 2>/dev/null; then
    echo "setup: building the native samplers (native/, Rust, maturin)"
    native_started=$SECONDS
    if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check \
            --force-reinstall --no-deps ./native; then
        echo "setup: building native/ failed (cargo $(cargo --version 2>/dev/null || echo missing));" \
             "the processor needs it: fix the build (DPC_SAMPLERS=reference runs without it)" >&2
        exit 4
    fi
    echo "$native_want" > "$native_stamp"
    echo "setup: native samplers built in $((SECONDS - native_started))s"
else
    echo "setup: native samplers are up to date"
fi

.venv/bin/python deploy/kafka.py fetch "$@"
# Kafka's command-line tools (kafka-topics, kafka-configs, kafka-consumer-groups, ...): the
# kafka-tools jar alone, run on the broker's classpath by deploy/kafka-tool.sh. Not part of
# the broker's own classpath (its dependencies would bring Connect, Jetty and Jersey).
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' deploy/kafka/pom.xml)"
if [ ! -f "deploy/.cache/kafka-tools/kafka-tools-$kafka_version.jar" ]; then
    echo "setup: fetching kafka-tools $kafka_version (Kafka's command-line tools)"
    rm -rf deploy/.cache/kafka-tools
    mvn -q -f deploy/kafka/pom.xml dependency:copy \
        -Dartifact="org.apache.kafka:kafka-tools:$kafka_version" \
        -DoutputDirectory="$PWD/deploy/.cache/kafka-tools" "$@"
fi
# The Java example subscriber's jars (examples/java/target/lib; its test is tests/examples).
bash examples/java/fetch-deps.sh "$@"

if [ "${SETUP_BROWSER:-1}" != 0 ] \
    && { ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; }; then
    as_root=""
    [ "$(id -u)" = 0 ] || as_root="$(command -v sudo || true)"
    if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" != 0 ] && [ -z "$as_root" ]; }; then
        echo "setup: chromium/chromedriver missing and no apt-get as root here: install a" \
             "headless Chromium and its chromedriver yourself, or the browser tests of" \
             "tests/view skip (and fail in CI)" >&2
    else
        echo "setup: installing chromium and chromium-driver (the live view's browser tests)"
        if ! { $as_root apt-get update -qq \
               && $as_root apt-get install -y -qq --no-install-recommends chromium chromium-driver; }; then
            echo "setup: installing chromium failed; the browser tests of tests/view will skip" >&2
        fi
    fi
fi
echo "setup: done in $((SECONDS - started))s"
