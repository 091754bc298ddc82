"""A setting the way a notebook session holds one: a default, blocks that override it, and a
change requested while a cell runs, kept for the cell's end.

Execution mode and precision both work so (``%tpu_mode`` / ``%%tpu_mode`` / the lab's mode
picker; ``%tpu_precision`` / ``%%tpu_precision`` / its precision picker): one class holds
that state for both, and ``Session`` adds what differs (checks, events, the scope to open).

A request can come from another thread (the lab's picker over the kernel's control channel,
while the notebook thread runs a cell), so the pending request is set and taken under a lock;
defaults and overrides change on the notebook thread only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Value = TypeVar("Value")


class ScopedSetting(Generic[Value]):
    """``default``; ``effective`` (the innermost override, else the default); ``pending``, a
    requested default with where it came from, waiting for the running cell to end."""

    def __init__(self, default: Value) -> None:
        self.default = default
        self._pending: tuple[Value, str] | None = None
        self._pending_lock = threading.Lock()
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

    @property
    def pending(self) -> tuple[Value, str] | None:
        return self._pending

    def request(self, value: Value, source: str) -> None:
        """Hold ``value`` as the next default, from ``source``, until the notebook thread takes it."""
        with self._pending_lock:
            self._pending = (value, source)

    def take_pending(self) -> tuple[Value, str] | None:
        """The requested default, now due (a cell ended or begins); none is pending afterwards."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        return pending
