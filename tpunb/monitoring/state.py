"""What the monitor shows, as one plain dict per tick, built from the session's records.

The monitor is a view: it reads ``Session.stats()`` and the event bus, never a runtime's
internals, so a new runtime or a new record kind shows up here without changes. Figures a
runtime cannot give stay ``None`` (shown as "n/a"), never 0.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from tpunb.session import Session

#: Memory samples kept for the timeline (about five minutes at 4 Hz).
TIMELINE_POINTS = 1200
#: Points sent per tick (the timeline is thinned to this many).
TIMELINE_SENT = 240
GROUPS_SHOWN = 12
CELLS_SHOWN = 12


class MonitorState:
    """Accumulates the memory timeline and builds the dict each tick sends."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.timeline: deque[tuple[float, int]] = deque(maxlen=TIMELINE_POINTS)
        self.ticks = 0

    def build(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The monitor's dict for one tick, from one ``Session.stats()`` snapshot."""
        now = time.time()
        memory = stats["memory"]
        if memory is not None and memory["used"] is not None:
            self.timeline.append((now, memory["used"]))
        self.ticks += 1
        bus = self.session.bus
        cells = [record.as_dict() for record in bus.recent("cell", CELLS_SHOWN)]
        return {
            "runtime": stats["runtime"],
            "device": stats["device"],
            "mode": stats["mode"],
            "precision": stats["precision"],
            "memory": memory,
            "timeline": self._thinned_timeline(now),
            "cells": cells[::-1],
            "groups": stats["group_rows"][:GROUPS_SHOWN],
            "groups_total": bus.count("group"),
            "cache": stats["cache"],
            "compile": stats["compile"],
            "last_compile": self._last_compile(),
            "last_recompile": self._last_recompile(),
            "tick": self.ticks,
        }

    def _last_compile(self) -> dict[str, Any] | None:
        """The newest compile: a group's in the background, or a call compiled whole in the
        call itself (its row's compile time), so that "last compile" agrees with the cache's
        compile time."""
        bus = self.session.bus
        found = [(c.time, c.key, c.ok, c.compile_ms) for c in bus.recent("compile", 1)]
        groups = bus.recent("group", 50)
        found += [(g.time, g.key, True, g.compile_ms) for g in groups if g.compile_ms is not None]
        if not found:
            return None
        _, key, ok, compile_ms = max(found)
        return {"key": key, "ok": ok, "compile_ms": compile_ms}

    def _last_recompile(self) -> str | None:
        """Why something compiled again, newest first: a fused miss or a compile-mode guard."""
        bus = self.session.bus
        candidates = [(g.time, g.miss_reason) for g in bus.recent("group", 50) if g.miss_reason]
        candidates += [
            (c.time, c.recompile_reasons[0]) for c in bus.recent("compiled", 50) if c.recompile_reasons
        ]
        return max(candidates)[1] if candidates else None

    def _thinned_timeline(self, now: float) -> list[list[float]]:
        points = list(self.timeline)
        step = max(1, len(points) // TIMELINE_SENT)
        return [[round(t - now, 2), used] for t, used in points[::step]]


def format_text(state: dict[str, Any]) -> str:
    """A compact snapshot for places without a widget frontend (terminals, nbconvert)."""
    from tpunb.report import format_bytes

    memory = state["memory"]
    if memory is None:
        memory_text = "memory n/a"
    else:
        memory_text = (
            f"{memory['label']} used {format_bytes(memory['used'])}, peak {format_bytes(memory['peak'])}, "
            f"limit {format_bytes(memory['limit'])}"
        )
    cache = state["cache"]
    requests = cache.get("requests") or 0
    rate = f"{cache['hits'] / requests:.0%}" if requests else "n/a"
    lines = [
        f"tpunb monitor · {state['runtime']} on {state['device']} · mode {state['mode']} "
        f"· {state['precision']}",
        f"  {memory_text}",
        f"  compile cache: {requests} requests, {cache['hits']} hits, {cache['misses']} misses "
        f"(hit rate {rate}), {cache['compiles']} compiles",
        f"  fusion groups: {state['groups_total']}",
        f"  last recompile: {state['last_recompile'] or 'n/a'}",
    ]
    for group in state["groups"][:5]:
        ops = ", ".join(f"{name}×{n}" for name, n in group["top_ops"].items())
        size = "whole call" if group.get("whole_call") else f"{group['ops']:>4} ops"
        timing = f"{size} capture {group['capture_ms']:7.2f} ms run {group['run_ms']:8.2f} ms"
        status = group["status"] + (f" {group['compiling_s']} s" if "compiling_s" in group else "")
        lines.append(f"    {status:<14} ×{group['count']:<5} {timing}  {ops}  ({group['trigger']})")
    return "\n".join(lines)
