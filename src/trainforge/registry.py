"""One small registry: register by decorator, look up by name, list the names.

Models, data sources, optimizers, schedules and (later) GPUs and exporters are all looked up
through a `Registry`, so adding one is one decorated function and a lookup error lists the
valid names.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from trainforge.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind  # e.g. "model"
        self.config_key = config_key  # e.g. "model.name": named in error messages
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            assert name not in self._entries, f"{self.kind} {name!r} registered twice"
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(
                f"{self.config_key}: unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
