"""A setting the way a notebook session holds one: a default, blocks that override it, and a
change requested while a cell runs, kept for the cell's end.

Execution mode and precision both work so (``%tpu_mode`` / ``%%tpu_mode`` / the lab's mode
picker; ``%tpu_precision`` / ``%%tpu_precision`` / its precision picker): one class holds
that state for both, and ``Session`` adds what differs (checks, events, the scope to open).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Value = TypeVar("Value")


class ScopedSetting(Generic[Value]):
    """``default``; ``effective`` (the innermost override, else the default); ``pending``, a
    requested default with where it came from, waiting for the running cell to end."""

    def __init__(self, default: Value) -> None:
        self.default = default
        self.pending: tuple[Value, str] | None = None
        self._overrides: list[Value] = []

    @property
    def effective(self) -> Value:
        return self._overrides[-1] if self._overrides else self.default

    @contextlib.contextmanager
    def overridden(self, value: Value, changed: Callable[[], None]) -> Iterator[None]:
        """``value`` while the block runs, the previous one back afterwards, even on error;
        ``changed`` runs after each switch (the session reopens its scope)."""
        self._overrides.append(value)
        try:
            changed()
            yield
        finally:
            self._overrides.pop()
            changed()

    def take_pending(self) -> tuple[Value, str] | None:
        """The requested default, now due (the cell ended); none is pending afterwards."""
        pending, self.pending = self.pending, None
        return pending
