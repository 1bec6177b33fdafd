"""Mechanism registry: name -> Counter class, make(), restore().

Built lazily on first use so that it picks up the edit-private mechanisms of
processor.core.ecc ("ecc", "simecc") when that module provides them, without a hard
import cycle or a failure while it is still being written.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from processor.core import state as state_codec
from processor.core.api import Counter
from processor.core.errors import InvalidParameterError, StateFormatError
from processor.core.rng import NoiseKey

#: Optional modules and the class names in them that register a mechanism.
_OPTIONAL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("processor.core.ecc", ("ECC", "SimECC")),
    ("processor.core.wrapper", ("W", "Wrapper", "WrappedECC")),
)


def _build() -> dict[str, type[Counter]]:
    from processor.core.baselines import BaseCC, GaussianCC, LaplaceTree, PartitionCC

    out: dict[str, type[Counter]] = {}
    for cls in (BaseCC, PartitionCC, GaussianCC, LaplaceTree):
        out[cls.mechanism] = cls
    for modname, names in _OPTIONAL:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name in names:
            found: Any = getattr(mod, name, None)
            if (isinstance(found, type) and issubclass(found, Counter)
                    and isinstance(getattr(found, "mechanism", None), str)):
                out[found.mechanism] = found
    return out


class _LazyRegistry(Mapping[str, type[Counter]]):
    """A read-only mapping that builds itself on first access."""

    def __init__(self) -> None:
        self._data: dict[str, type[Counter]] | None = None

    def _get(self) -> dict[str, type[Counter]]:
        if self._data is None:
            self._data = _build()
        return self._data

    def __getitem__(self, name: str) -> type[Counter]:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def reload(self) -> None:
        """Forget the table (tests, or after a module landed in a long-lived process)."""
        self._data = None


#: Every registered mechanism by name.
MECHANISMS = _LazyRegistry()


def names() -> list[str]:
    """The registered mechanism names, sorted."""
    return sorted(MECHANISMS)


def get(name: str) -> type[Counter]:
    """The class registered as `name`; InvalidParameterError naming the valid ones if none."""
    if not isinstance(name, str) or name not in MECHANISMS:
        raise InvalidParameterError(
            f"unknown mechanism {name!r}; valid: {', '.join(names())}")
    return MECHANISMS[name]


def make(name: str, eps: float, delta: float, key: NoiseKey, counter_id: str = "",
         **params: Any) -> Counter:
    """A fresh counter of mechanism `name`. Unknown parameters raise InvalidParameterError."""
    cls = get(name)
    try:
        return cls(eps, delta, key, counter_id, **params)  # type: ignore[call-arg]
    except TypeError as exc:
        raise InvalidParameterError(f"bad parameters for {name!r}: {exc}") from None


def restore(data: bytes, key: NoiseKey) -> Counter:
    """Restore any registered counter from its state (dispatch on the stored name)."""
    name = state_codec.peek_mechanism(data)
    if name not in MECHANISMS:
        raise StateFormatError(f"state is for unknown mechanism {name!r}")
    return MECHANISMS[name].from_bytes(data, key)
