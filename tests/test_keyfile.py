"""The noise key file's permissions (processor/keyfile.py, the one reader): open to other
users is refused with one line naming the file and `chmod 600`; open to the group is read
with a warning (Kubernetes mounts secrets 0440 under the pod's fsGroup); private (0600,
0400) is read in silence. Through `count --key-file` the refusal is one `error:` line,
exit 2. Controls: the same key bytes at 0600 are read."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from processor.commands.main import main
from processor.core.errors import NoiseKeyError
from processor.keyfile import read_key, write_key


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o666, 0o601])
def test_a_key_open_to_other_users_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_key(tmp_path / "k")
    path.chmod(mode)
    with pytest.raises(NoiseKeyError, match=f"mode {mode:04o}.*chmod 600"):
        read_key(path)
    path.chmod(0o600)  # control
    read_key(path)


@pytest.mark.parametrize("mode", [0o640, 0o440])
def test_a_key_open_to_its_group_is_read_with_a_warning(
        tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture) -> None:
    path = write_key(tmp_path / "k")
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, "processor.keyfile"):
        read_key(path)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert f"mode {mode:04o}" in caplog.text and "fsGroup" in caplog.text


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_key_is_read_in_silence(tmp_path: Path, mode: int,
                                          caplog: pytest.LogCaptureFixture) -> None:
    path = write_key(tmp_path / "k")
    path.chmod(mode)
    with caplog.at_level(logging.DEBUG):
        read_key(path)
    assert caplog.records == []


def test_count_refuses_a_world_readable_key_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_key(tmp_path / "k")
    ticks = tmp_path / "ticks"
    ticks.write_text("1\n0\n")
    argv = ["count", "--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6",
            "--key-file", str(path), "--input", str(ticks)]
    path.chmod(0o644)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: noise key") and "0644" in err
    path.chmod(0o600)  # control
    assert main(argv) == 0
