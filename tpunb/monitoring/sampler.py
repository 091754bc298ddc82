"""One sampler thread per kernel: builds the monitor state and pushes it to the widgets.

Widget state travels over IOPub, which ipykernel sends from its own thread, so trait
changes made here reach the page while a cell keeps the main thread busy (measured in
research/notebook_ecosystem.md). The thread never prints, batches each tick into one
trait change, skips ticks where nothing changed, slows down when the kernel is idle, and
ends when no monitor widget is left.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from tpunb.monitoring.state import MonitorState

FAST_PERIOD_S = 0.25  # 4 Hz while things change
SLOW_PERIOD_S = 0.5  # 2 Hz when nothing did for a while
IDLE_TICKS = 8  # unchanged ticks before slowing down


class Sampler:
    """Feeds every live monitor widget of this process; started on demand."""

    def __init__(self, state: MonitorState) -> None:
        self.state = state
        self._widgets: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ticks_sent = 0

    def attach(self, widget: Any) -> None:
        with self._lock:
            self._widgets.add(widget)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="tpunb-monitor", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _live_widgets(self) -> list[Any]:
        with self._lock:
            return [w for w in self._widgets if w.wanted()]

    def _run(self) -> None:
        unchanged = 0
        previous: dict[str, Any] | None = None
        while not self._stop.is_set():
            widgets = self._live_widgets()
            if not widgets:
                return
            state = self.state.build()
            comparable = {k: v for k, v in state.items() if k not in ("tick", "timeline")}
            if comparable != previous:
                for widget in widgets:
                    widget.push(state)
                self.ticks_sent += 1
                unchanged = 0
            else:
                unchanged += 1
            previous = comparable
            self._stop.wait(FAST_PERIOD_S if unchanged < IDLE_TICKS else SLOW_PERIOD_S)
