"""Mechanism registry: name -> Counter class, make(), restore().

Built on first use, so importing the registry does not import every mechanism module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from processor.core import state as state_codec
from processor.core.api import Counter
from processor.core.errors import InvalidParameterError, StateFormatError
from processor.core.rng import NoiseKey


def _build() -> dict[str, type[Counter]]:
    from processor.core.baselines import BaseCC, GaussianCC, LaplaceTree, PartitionCC
    from processor.core.ecc import ECC, SimECC
    from processor.core.wrapper import W

    classes: tuple[type[Counter], ...] = (
        BaseCC, PartitionCC, GaussianCC, LaplaceTree, ECC, SimECC, W)
    return {cls.mechanism: cls for cls in classes}


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
