"""One row per distinct fusion group, however often it ran: what views list as "groups".

A training loop flushes the same group every step; a row per flush would bury everything
else (853 identical rows after 8 s of a loop). A row is the group's latest record plus how
often it ran and, while it compiles in the background, since when. A finished compile turns
the row to compiled (or failed) at once, without waiting for the group's next flush.

``GroupRows`` subscribes to the session's event bus, so its counts cover the whole session (the
bus keeps only a bounded history) whether or not a view was open when the groups ran.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tpunb.events import CompileDone, FusionGroup, GroupStatus, Record

#: Distinct groups remembered (the least recently run is forgotten first).
GROUPS_FOLDED = 256


@dataclass
class _Row:
    """A distinct group: its latest record, turned into a dict only when a view asks."""

    record: FusionGroup
    count: int
    compiling_since: float | None = None
    compiled: dict[str, Any] | None = None  # status and compile_ms once its compile finished


class GroupRows:
    """The session's distinct groups, for every view (the monitor, ``tpunb.stats()``)."""

    def __init__(self) -> None:
        self._rows: OrderedDict[str, _Row] = OrderedDict()
        self._lock = threading.Lock()  # records arrive on the cell's and the compiler's threads

    def observe(self, record: Record) -> None:
        """The bus subscriber: quick, on the publishing thread (once per flush)."""
        if isinstance(record, FusionGroup):
            self._add_group(record)
        elif isinstance(record, CompileDone):
            self._compile_done(record)

    def _add_group(self, record: FusionGroup) -> None:
        with self._lock:
            previous = self._rows.pop(record.key, None)
            row = _Row(record, (previous.count if previous else 0) + 1)
            if record.status == GroupStatus.COMPILING:
                row.compiling_since = (previous.compiling_since if previous else None) or record.time
            self._rows[record.key] = row
            if len(self._rows) > GROUPS_FOLDED:
                self._rows.popitem(last=False)

    def _compile_done(self, done: CompileDone) -> None:
        with self._lock:
            row = self._rows.get(done.key)
            if row is not None and row.record.status == GroupStatus.COMPILING and row.compiled is None:
                row.compiling_since = None
                status = GroupStatus.COMPILED if done.ok else GroupStatus.COMPILE_FAILED
                row.compiled = {"status": status, "compile_ms": done.compile_ms}

    def rows(self, now: float, limit: int) -> list[dict[str, Any]]:
        """The most recently run groups first, each with ``compiling_s`` while it compiles."""
        with self._lock:
            latest = list(self._rows.values())[-limit:][::-1]
        shown = []
        for row in latest:
            shown.append({**row.record.as_dict(), "count": row.count, **(row.compiled or {})})
            if row.compiling_since is not None:
                shown[-1]["compiling_s"] = round(now - row.compiling_since, 1)
        return shown
