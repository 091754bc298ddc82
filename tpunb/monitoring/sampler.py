"""The kernel's one sampler thread: one ``Session.stats()`` snapshot per tick, fed to every view.

Views are sinks: the monitor widgets, the JupyterLab extension's status item (through the
lab link) and its side panel. Each says whether it still wants ticks (``wanted``) and takes
them (``push``); the thread runs only while at least one does, so a kernel nobody looks at
(nbclient, a bare jupyter_client, a page without the extension) has no thread polling.

Widget and comm messages travel over IOPub, which ipykernel sends from its own thread, so
what a tick pushes reaches the page while a cell keeps the main thread busy (measured: a real
JupyterLab advanced a widget at about 5 Hz while a busy cell ran; none gets out while the main
thread holds the GIL in one long C call). The thread never prints, skips ticks where nothing
changed, slows down when nothing has for a while, and ends when no sink is left.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from tpunb.monitoring.state import MonitorState
from tpunb.session import Session

FAST_PERIOD_S = 0.25  # 4 Hz while things change
SLOW_PERIOD_S = 0.5  # 2 Hz when nothing did for a while
IDLE_TICKS = 8  # unchanged ticks before slowing down
THREAD_NAME = "tpunb-sampler"


@dataclass(frozen=True)
class Tick:
    """What one tick read: the session's snapshot and the monitor's view of it."""

    stats: dict[str, Any]
    monitor: dict[str, Any]
    monitor_changed: bool  # anything but the tick counter and the timeline moved


class Sink(Protocol):
    def wanted(self) -> bool: ...

    def push(self, tick: Tick) -> None: ...


def _comparable(monitor: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in monitor.items() if k not in ("tick", "timeline")}


class Sampler:
    """Feeds every sink of this process; the thread starts with the first sink that wants it."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = MonitorState(session)
        self._sinks: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_monitor: dict[str, Any] | None = None
        self.ticks_sent = 0

    def snapshot(self) -> Tick:
        """A reading for a view's first picture; the ticks' change tracking is left alone."""
        stats = self.session.stats()
        return Tick(stats, self.state.build(stats), monitor_changed=True)

    def _tick(self) -> Tick:
        stats = self.session.stats()
        monitor = self.state.build(stats)
        comparable = _comparable(monitor)
        changed, self._last_monitor = comparable != self._last_monitor, comparable
        return Tick(stats, monitor, changed)

    def attach(self, sink: Sink) -> None:
        """Feed ``sink`` from now on (again: harmless); starts the thread if it is not running."""
        with self._lock:
            self._sinks.add(sink)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _wanted_sinks(self) -> list[Sink]:
        """The sinks to feed; none left ends the thread (decided under the lock, so a sink
        attached meanwhile starts a new one)."""
        with self._lock:
            sinks = [sink for sink in self._sinks if sink.wanted()]
            if not sinks:
                self._thread = None
            return sinks

    def _run(self) -> None:
        unchanged = 0
        while not self._stop.is_set():
            sinks = self._wanted_sinks()
            if not sinks:
                return
            tick = self._tick()
            for sink in sinks:
                sink.push(tick)
            if tick.monitor_changed:
                self.ticks_sent += 1
                unchanged = 0
            else:
                unchanged += 1
            self._stop.wait(FAST_PERIOD_S if unchanged < IDLE_TICKS else SLOW_PERIOD_S)
