"""Which JAX calls compiled, and for how long: JAX's own monitoring events.

JAX reports each XLA compile as a ``/jax/core/compile/backend_compile_duration`` event; a
call that produced none was a jit-cache hit. One listener is registered for the process;
the counts are per thread, so a compile in another thread is not charged to this op.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tpunb.jaxops.bridge import require_jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass
class CompileTally:
    compiles: int = 0
    seconds: float = 0.0


_local = threading.local()
_registered = False
_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **_: object) -> None:
    tally: CompileTally | None = getattr(_local, "tally", None)
    if tally is not None and event == COMPILE_EVENT:
        tally.compiles += 1
        tally.seconds += duration_secs


@contextmanager
def watch_compiles() -> Iterator[CompileTally]:
    """Count the JAX compiles this thread does inside the block."""
    global _registered
    with _lock:
        if not _registered:
            require_jax().monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True
    outer = getattr(_local, "tally", None)
    tally = _local.tally = CompileTally()
    try:
        yield tally
    finally:
        _local.tally = outer
        if outer is not None:
            outer.compiles += tally.compiles
            outer.seconds += tally.seconds
