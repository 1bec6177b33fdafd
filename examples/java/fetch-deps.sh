#!/usr/bin/env bash
# Copies the Java subscriber's jars (pom.xml) into examples/java/target/lib, once: a stamp
# of pom.xml makes a rerun a no-op. Called by deploy/setup.sh and by the example's test.
# Needs java and mvn on PATH; extra arguments go to Maven (e.g. -Dmaven.repo.local=...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
lib=target/lib
stamp=target/.deps-stamp
want="$(sha256sum pom.xml | cut -d' ' -f1)"
if [ -d "$lib" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    exit 0
fi
rm -rf "$lib"
mkdir -p target
if ! mvn -q -B -f pom.xml dependency:copy-dependencies -DoutputDirectory="$lib" "$@" \
        > target/maven.log 2>&1; then
    echo "examples/java: mvn failed:" >&2
    tail -n 30 target/maven.log >&2
    exit 1
fi
echo "$want" > "$stamp"
