"""The cell's waits: every point where the host stopped for values, with the user's line.

Two kinds of wait, seen in two places, never both for the same read:

* a read of a plain tensor (``.item()``, ``if tensor:``, ``print``, ``.cpu()``): on a GPU or
  TPU the host waits there for the device's queue. ``WaitWatcher``, a ``TorchFunctionMode``,
  times each outermost read and notes the user's line.
* a read of one of the fused engine's tensors: the engine flushes its group to produce the
  value, and publishes that group with ``wait=True`` and the line (events.FusionGroup). The
  watcher leaves these reads to the engine, so a flush is counted once, with its run time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from torch.overrides import TorchFunctionMode

from tpunb.events import FusionGroup
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.source import locate
from tpunb.value_reads import read_name


@dataclass(frozen=True)
class Wait:
    """One wait: what read values, at which line of the user's, for how long."""

    what: str
    at: str
    seconds: float
    ended: float  # wall clock (time.time()), as event records are stamped


class WaitWatcher(TorchFunctionMode):
    """Times value reads of plain tensors (a read inside a read counts once: torch runs the
    mode's handler with the mode off)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[Wait] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = read_name(func, args, kwargs) if args and type(args[0]) is not DeferredTensor else None
        if what is None:
            return func(*args, **kwargs)
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            where = locate(sys._getframe(1))
            seconds = time.perf_counter() - started
            self.waits.append(Wait(what, where.label if where else "?", seconds, time.time()))


def engine_waits(groups: Iterable[FusionGroup]) -> list[Wait]:
    """The fused engine's flushes for values, as waits: their run time, less a compile the
    flush waited for (that is the compile's cost, which its own findings count: reading values
    less often would not save it)."""
    waits = []
    for group in groups:
        if group.wait:
            reason = group.trigger.removesuffix(f" at {group.at}") if group.at else group.trigger
            seconds = max(0.0, group.run_ms - (group.compile_ms or 0.0)) / 1000
            waits.append(Wait(reason, group.at or "?", seconds, group.time))
    return waits


def wait_rows(waits: Iterable[Wait]) -> list[dict]:
    """Waits folded by line and kind, the costliest first: ``at``, ``what``, ``count``, ``seconds``."""
    rows: dict[tuple[str, str], dict] = {}
    for wait in waits:
        row = rows.setdefault(
            (wait.at, wait.what), {"at": wait.at, "what": wait.what, "count": 0, "seconds": 0.0}
        )
        row["count"] += 1
        row["seconds"] += wait.seconds
    return sorted(rows.values(), key=lambda row: -row["seconds"])
