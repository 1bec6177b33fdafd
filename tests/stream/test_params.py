"""A change of privacy parameters under existing state, against the real broker and
worker.

A worker runs counter `a` with epsilon 500, stops, and is restarted with epsilon 400 in its
config file. Before, the change was ignored silently (releases said `epsilon: 500.0` under
the new configuration's fingerprint). Now the worker refuses: exit code 2, one `error:`
line naming the field and the counter, no traceback, nothing more published. With
`on_parameter_change = "keep"` it runs, and the counter's releases carry its stored
epsilon (500), not the configured one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from processor.devtools.deployment import write_config
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import changelog_topic
from processor.stream.model.config import with_overrides
from tests.stream.refusals import ran_and_stopped, refused


def test_changed_epsilon_is_refused_unless_kept(
        deployment_factory: Callable[..., Any]) -> None:
    dep = ran_and_stopped(deployment_factory, "params")
    worker = dep.worker
    published = len(dep.releases())

    # Restart with another epsilon: refused at the first record that restores `a`.
    changed = with_overrides(dep.settings, epsilon=400.0)
    write_config(changed, dep.config)
    worker.start()
    error, log = refused(worker)
    assert error.startswith("error: epsilon: counter 'a' runs with epsilon = 500.0"), log
    assert "400.0" in error and "on_parameter_change" in error, log
    assert len(dep.releases()) == published  # nothing published under the refusal

    # The operator states the choice: the counter continues under its stored epsilon.
    kept = with_overrides(changed, on_parameter_change="keep")
    write_config(kept, dep.config)
    worker.start()
    releases = dep.wait_releases(lambda rs: len(rs) >= published + 3, timeout_s=120)
    assert worker.stop() == 0, worker.log_tail()
    later = releases[published:]
    assert later and {r["counter"] for r in later} == {"a"}
    assert {r["epsilon"] for r in later} == {500.0}
    assert {r["fingerprint"] for r in later} == {kept.fingerprint()}


def test_corrupt_state_names_the_key_and_the_remedy(
        deployment_factory: Callable[..., Any]) -> None:
    """A corrupt counter state on the changelog (the worker rebuilds its
    local state from it) stops the worker with exit code 2 and one `error:` line naming the
    key (a declared counter: public) and the remedy, no traceback. Before, it exited 1
    with "operator failed (StateFormatError)", naming neither."""
    dep = ran_and_stopped(deployment_factory, "corrupt")
    worker = dep.worker
    # The newest changelog value of c/a is garbage behind a valid header that says it is
    # newer than anything written (a value without one would not replace a newer one:
    # state.supersedes); the local copy is gone, so the next start restores the table
    # from the changelog.
    garbage = b"DPC\x04" + (1 << 40).to_bytes(8, "big") + b"garbage"
    kafka_io.produce_all(dep.conf, changelog_topic(dep.settings), [(b"c/a", garbage)],
                         partition=0)
    shutil.rmtree(Path(dep.settings.state_dir) / dep.settings.app_id, ignore_errors=True)
    worker.start()
    error, log = refused(worker)
    assert "'c/a'" in error and changelog_topic(dep.settings) in error, log
    assert "new deployment" in error, log
