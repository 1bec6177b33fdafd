"""Noise key files: the one reader and the one writer.

Outside processor/core because it does file I/O (the core only turns bytes into a
`NoiseKey`, `NoiseKey.from_bytes`, under the one format rule of `KEY_FORMATS`). Used by
`keygen`, `count`, the demo and test deployments, the tests and the benchmarks.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from processor.core.errors import NoiseKeyError
from processor.core.rng import NoiseKey

__all__ = ["check_private", "make_private_dirs", "read_key", "write_key"]

log = logging.getLogger("processor.keyfile")


def read_key(path: str | os.PathLike[str], key_format: str = "hex") -> NoiseKey:
    """The key in file `path`, read in `key_format` (KEY_FORMATS; "hex" is what `keygen`
    writes). NoiseKeyError names the file and the rule, never the content."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        mode = stat.S_IMODE(p.stat().st_mode)
    except OSError as exc:
        raise NoiseKeyError(f"cannot read noise key file {str(p)!r}: {exc.strerror}") from None
    check_private(p, mode)
    return NoiseKey.from_bytes(raw, key_format, f"noise key file {str(p)!r}")


def check_private(path: Path, mode: int) -> None:
    """The key file's permissions (`mode`): any access for other users is refused
    (NoiseKeyError: whoever reads the key and the timeline can remove the noise); read
    access for the group gets a warning, because a group the worker alone is in is how
    Kubernetes mounts secrets (deploy/k8s: defaultMode 0440 with the pod's fsGroup)."""
    if mode & 0o007:
        raise NoiseKeyError(
            f"noise key file {str(path)!r} is open to other users (mode {mode:04o}): "
            f"whoever reads it can remove the noise; make it private (chmod 600 {path})")
    if mode & 0o070:
        log.warning("noise key file %r is open to its group (mode %04o): fine when the "
                    "group is the worker's own (a Kubernetes fsGroup), else make it private "
                    "(chmod 600 %s)", str(path), mode, path)


def write_key(path: str | os.PathLike[str], secret: bytes | None = None, *,
              overwrite: bool = True) -> Path:
    """Write a noise key file as `read_key` reads it: hex text, mode 0600.

    The one key writer (`keygen`, the demo, the tests and the benchmarks). A fresh random
    key unless `secret` is given. The file is mode 0600 whatever existed before: an existing
    file is never truncated in place (it would keep its old, maybe world-readable, mode);
    the key goes to a new 0600 file in the same directory that then replaces it in one
    rename, so a reader sees the old key or the new one, never half of one.
    With `overwrite=False` an existing file raises FileExistsError and is left untouched.
    """
    target = Path(path)
    text = ((NoiseKey.generate() if secret is None else secret).hex() + "\n").encode("ascii")
    if not overwrite:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        _write_private(fd, text)
        return target
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        _write_private(fd, text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _write_private(fd: int, data: bytes) -> None:
    # fchmod: os.open's mode is filtered by the umask; the key file is exactly 0600.
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def make_private_dirs(directory: Path) -> list[Path]:
    """Create `directory` and its missing parents with mode 0700 (whatever the umask);
    directories that exist are left as they are. Returns the ones created, outermost first."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    for d in missing:
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:  # created meanwhile by someone else: theirs, untouched
            continue
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask
    return missing
