"""The comm behind tpunb's JupyterLab extension (``extension/``): mode and memory out to the
page, the mode picker and the side-panel monitor back in.

Every message is a JSON dict with a ``type``:

- kernel → page ``state``: runtime, device, mode (in effect now), default, the modes this
  runtime runs, whether a cell is running, a picked mode still pending, memory. Sent when a
  comm opens and then whenever it changes: a thread checks every 0.25 s and reads memory at
  most once a second. The thread sends over IOPub, so the page hears of a ``%%tpu_mode`` cell
  or a growing HBM peak while the cell is still running.
- page → kernel ``set_mode`` {mode}: the picker. Between cells it applies at once; if a cell
  is running it applies when that cell ends (``Session.request_default``) and ``pending``
  says so meanwhile. A mode that is unknown or that this runtime cannot run is answered with
  ``error`` {message}, and nothing changes.
- page → kernel ``monitor`` {open}: the side panel. While one is open the monitor's sampler
  feeds it ``monitor`` {state}, after one ``monitor_view`` {esm, css}: the widget's own view
  code, so the panel and the notebook widget are the same view.
- page → kernel ``graph`` {key}: a fusion group clicked in that panel; answered with
  ``graph`` {key, code}.

``%load_ext tpunb`` opens one comm towards the pages connected now (they register the
target ``tpunb`` on every kernel connection). A page that connects later (a reload, a second
tab) finds it with a comm-info request and opens its own comm, which the kernel accepts
through the same target; state goes to every open comm.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any

from tpunb.modes import ModeConfig, ModeError
from tpunb.runtimes import ModeUnavailable
from tpunb.session import Session

TARGET = "tpunb"
POLL_S = 0.25
MEMORY_PERIOD_S = 1.0


class LabLink:
    """All comms of this kernel to the lab extension, and the thread that keeps them current."""

    def __init__(self, session: Session, version: str) -> None:
        self.session = session
        self.version = version
        self._comms: list[Any] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._memory: dict[str, Any] | None = None
        self._memory_read_at = 0.0
        self._sent: dict[str, Any] | None = None
        self._panel = PanelFeed(self)

    # --- opening -------------------------------------------------------------------------

    def open(self) -> None:
        """Register the target that later pages open their comms to, then announce."""
        from comm import get_comm_manager

        get_comm_manager().register_target(TARGET, self._accept)
        self.announce()

    def announce(self) -> None:
        """Open a comm towards the pages connected now (they registered the target)."""
        from comm import create_comm

        self._adopt(create_comm(target_name=TARGET, data=self.state(), metadata={"version": self.version}))

    def close(self) -> None:
        from comm import get_comm_manager

        get_comm_manager().unregister_target(TARGET, self._accept)
        self._stop.set()
        with self._lock:
            comms, self._comms = self._comms, []
        for comm in comms:
            comm.close()

    def _accept(self, comm: Any, open_msg: dict[str, Any]) -> None:
        """A page that connected after ``%load_ext`` opened its own comm."""
        self._adopt(comm)
        comm.send(self.state())

    def _adopt(self, comm: Any) -> None:
        comm.on_msg(self._on_message)
        comm.on_close(lambda msg, comm=comm: self._forget(comm))
        with self._lock:
            self._comms.append(comm)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._watch, name="tpunb-lab", daemon=True)
                self._thread.start()

    def _forget(self, comm: Any) -> None:
        with self._lock:
            if comm in self._comms:
                self._comms.remove(comm)

    @property
    def comm_count(self) -> int:
        with self._lock:
            return len(self._comms)

    # --- kernel → page -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        session = self.session
        pending = session.pending_default
        return {
            "type": "state",
            "version": self.version,
            "runtime": session.runtime.name,
            "device": session.runtime.device,
            "mode": session.effective.mode.value,
            "default": session.default.mode.value,
            "modes": session.available_modes,
            "busy": session.cell_running,
            "pending": pending.mode.value if pending is not None else None,
            "memory": self._current_memory(),
        }

    def _current_memory(self) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - self._memory_read_at >= MEMORY_PERIOD_S:
            memory = self.session.runtime.memory()
            self._memory = asdict(memory) if memory is not None else None
            self._memory_read_at = now
        return self._memory

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            comms = list(self._comms)
        for comm in comms:
            comm.send(message)

    def push_state(self, force: bool = False) -> None:
        """Send the state if it changed since the last one sent (or always, with ``force``)."""
        state = self.state()
        if force or state != self._sent:
            self._sent = state
            self.send(state)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                if not self._comms:  # decided under the lock, so _adopt starts a new thread
                    self._thread = None
                    return
            self.push_state()

    # --- page → kernel -------------------------------------------------------------------

    def _on_message(self, msg: dict[str, Any]) -> None:
        data = msg["content"]["data"]
        kind = data.get("type")
        if kind == "set_mode":
            self._set_mode(data.get("mode"))
        elif kind == "monitor":
            self._panel.set_open(bool(data.get("open")))
        elif kind == "graph":
            from tpunb.monitoring.widget import graph_answer

            answer = graph_answer(self.session.runtime.group_graph, str(data.get("key")))
            self.send({"type": "graph", **answer})
        else:
            self.send({"type": "error", "message": f"tpunb: unknown request {kind!r}"})

    def _set_mode(self, name: Any) -> None:
        try:
            self.session.request_default(ModeConfig.build(name), source="lab")
        except (ModeError, ModeUnavailable) as error:
            self.send({"type": "error", "message": str(error)})
        self.push_state(force=True)


class PanelFeed:
    """The extension's side panel as one more sink of the monitor's sampler (it duck-types
    the widget's ``push``/``wanted``), so the panel ticks exactly like the notebook widget."""

    def __init__(self, link: LabLink) -> None:
        self.link = link
        self.open = False

    def set_open(self, open_: bool) -> None:
        from tpunb.monitoring import sampler_for
        from tpunb.monitoring.widget import VIEW_CSS, VIEW_ESM

        self.open = open_
        if not open_:
            return
        self.link.send({"type": "monitor_view", "esm": VIEW_ESM.read_text(), "css": VIEW_CSS.read_text()})
        sampler = sampler_for(self.link.session)
        self.push(sampler.state.build())
        sampler.attach(self)

    def push(self, state: dict[str, Any]) -> None:
        self.link.send({"type": "monitor", "state": state})

    def wanted(self) -> bool:
        return self.open and self.link.comm_count > 0


_link: LabLink | None = None


def open_lab_link(session: Session, version: str) -> LabLink:
    """The kernel's one link (``%load_ext`` again reuses it and re-announces the state)."""
    global _link
    if _link is None or _link.session is not session:
        _link = LabLink(session, version)
        _link.open()
    elif _link.comm_count == 0:
        _link.announce()
    else:
        _link.push_state(force=True)
    return _link


def close_lab_link() -> None:
    global _link
    if _link is not None:
        _link.close()
        _link = None
