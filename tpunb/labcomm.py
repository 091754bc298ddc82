"""The comm behind tpunb's JupyterLab extension (``extension/``): mode and memory out to the
page, the mode picker and the side-panel monitor back in.

Every message is a JSON dict with a ``type``:

- page → kernel ``hello``: a page took the comm the kernel opened. Until a page speaks on a
  comm, nothing is sent on it after the first state: nbclient and a bare jupyter_client never
  answer, and a kernel nobody looks at must not poll. A page sends ``hello``, ``monitor`` and,
  while a cell runs, ``set_mode``/``set_precision`` on the kernel's control channel when the
  state says ``control`` (``tpunb.lab_control``), naming the comm by ``comm_id``: there they
  arrive while cells run, Run All's queued cells included.
- kernel → page ``state``: runtime, device, mode (in effect now), default, the modes this
  runtime runs, whether a cell is running, a picked mode still pending, memory, all read
  from ``Session.stats()``. Sent when a comm opens and then whenever it changes (memory alone
  at most once a second), from the kernel's one sampler (``tpunb.monitoring.sampler``),
  which sends over IOPub, so the page hears of a ``%%tpu_mode`` cell or a growing HBM peak
  while the cell is still running.
- page → kernel ``set_mode`` {mode}: the picker. Between cells it applies at once; if a cell
  is running it applies when that cell ends (``Session.request_default``) and ``pending``
  says so meanwhile; one sent on the control channel waits for the running cell's end, or,
  if none runs, applies as soon as the notebook thread is free. A mode that is unknown or
  that this runtime cannot run is answered with ``error`` {message}, and nothing changes.
- page → kernel ``monitor`` {open}: the side panel. While one is open the monitor's sampler
  feeds it ``monitor`` {state}, after one ``monitor_view`` {esm, css}: the widget's own view
  code, so the panel and the notebook widget are the same view.
- page → kernel ``graph`` {key}: a fusion group clicked in that panel; answered with
  ``graph`` {key, code}.

``%load_ext tpunb`` opens one comm towards the pages connected now (they register the
target ``tpunb`` on every kernel connection). A page that connects later (a reload, a second
tab) finds it with a comm-info request and opens its own comm, which the kernel accepts
through the same target; state goes to every open comm that a page has spoken on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tpunb.lab_control import ControlRequests
from tpunb.mixed_precision import PrecisionError, parse_precision
from tpunb.modes import ModeConfig, ModeError
from tpunb.monitoring import sampler_for
from tpunb.monitoring.sampler import Tick
from tpunb.runtimes import ModeUnavailable
from tpunb.session import Session

TARGET = "tpunb"
#: Memory moves all the time; alone it refreshes the status bar at most this often.
MEMORY_PERIOD_S = 1.0
#: What a page may ask over the control channel: nothing there runs on the notebook thread.
CONTROL_REQUESTS = frozenset({"hello", "monitor", "set_mode", "set_precision"})


class LabLink:
    """All comms of this kernel to the lab extension; a sink of the kernel's sampler while a
    page is there."""

    def __init__(self, session: Session, version: str, kernel: Any = None) -> None:
        self.session = session
        self.version = version
        self._comms: list[Any] = []
        self._heard: set[str] = set()  # ids of the comms a page has spoken on
        self._lock = threading.Lock()
        self._control = ControlRequests(kernel, self._on_control) if kernel is not None else None
        self._push_lock = threading.Lock()  # the sampler and the control thread both push
        self._sent: dict[str, Any] | None = None
        self._memory_sent_at = 0.0
        self._panel = PanelFeed(self)

    # --- opening -------------------------------------------------------------------------

    def open(self) -> None:
        """Register the target that later pages open their comms to, then announce."""
        from comm import get_comm_manager

        get_comm_manager().register_target(TARGET, self._accept)
        if self._control is not None:
            self._control.install()
        self.announce()

    def announce(self) -> None:
        """Open a comm towards the pages connected now (they registered the target)."""
        from comm import create_comm

        state = self.state(self.session.stats())
        self._adopt(create_comm(target_name=TARGET, data=state, metadata={"version": self.version}))

    def close(self) -> None:
        from comm import get_comm_manager

        get_comm_manager().unregister_target(TARGET, self._accept)
        if self._control is not None:
            self._control.uninstall()
        with self._lock:
            comms, self._comms = self._comms, []
            self._heard.clear()
        for comm in comms:
            comm.close()

    def _accept(self, comm: Any, open_msg: dict[str, Any]) -> None:
        """A page that connected after ``%load_ext`` opened its own comm: it is there."""
        self._adopt(comm)
        self._heard_on(comm)
        comm.send(self.state(self.session.stats()))

    def _adopt(self, comm: Any) -> None:
        comm.on_msg(lambda msg, comm=comm: self._on_message(comm, msg))
        comm.on_close(lambda msg, comm=comm: self._forget(comm))
        with self._lock:
            self._comms.append(comm)

    def _heard_on(self, comm: Any) -> None:
        with self._lock:
            self._heard.add(comm.comm_id)
        sampler_for(self.session).attach(self)

    def _forget(self, comm: Any) -> None:
        with self._lock:
            if comm in self._comms:
                self._comms.remove(comm)
            self._heard.discard(comm.comm_id)

    @property
    def comm_count(self) -> int:
        """Comms a page is on (spoke on, or opened itself)."""
        with self._lock:
            return len(self._heard)

    # --- kernel → page -------------------------------------------------------------------

    def state(self, stats: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "state",
            "version": self.version,
            "runtime": stats["runtime"],
            "device": stats["device"],
            "mode": stats["mode"],
            "default": stats["default_mode"],
            "modes": stats["modes_available"],
            "busy": stats["busy"],
            "pending": stats["pending_default"],
            "memory": stats["memory"],
            "precision": stats["precision"],
            "default_precision": stats["default_precision"],
            "precisions": stats["precisions_available"],
            "pending_precision": stats["pending_precision"],
            "control": self._control is not None and self._control.installed,
        }

    def send(self, message: dict[str, Any]) -> None:
        """To every comm a page is on."""
        with self._lock:
            comms = [comm for comm in self._comms if comm.comm_id in self._heard]
        for comm in comms:
            comm.send(message)

    def push_state(self, stats: dict[str, Any], force: bool = False) -> None:
        """Send the state if it changed since the last one sent (or always, with ``force``);
        a change of memory alone waits until MEMORY_PERIOD_S has passed."""
        state = self.state(stats)
        with self._push_lock:
            sent = self._sent
            if not force and sent is not None:
                if state == sent:
                    return
                memory_only = {**state, "memory": sent["memory"]} == sent
                if memory_only and time.monotonic() - self._memory_sent_at < MEMORY_PERIOD_S:
                    return
            self._sent = state
            if sent is None or state["memory"] != sent["memory"]:
                self._memory_sent_at = time.monotonic()
            self.send(state)

    # --- the sampler's sink ---------------------------------------------------------------

    def wanted(self) -> bool:
        return self.comm_count > 0

    def push(self, tick: Tick) -> None:
        self.push_state(tick.stats)

    # --- page → kernel -------------------------------------------------------------------

    def _on_message(self, comm: Any, msg: dict[str, Any]) -> None:
        self._handle(comm, msg["content"]["data"], off_thread=False)

    def _on_control(self, request: dict[str, Any]) -> None:
        """A request on the control channel (``tpunb.lab_control``), on its thread."""
        with self._lock:
            comm = next((c for c in self._comms if c.comm_id == request.get("comm_id")), None)
        if comm is None:  # a comm this kernel no longer has (restarted, closed): nobody to answer
            return
        if request.get("type") not in CONTROL_REQUESTS:
            refused = f"tpunb: {request.get('type')!r} is not served on control"
            comm.send({"type": "error", "message": refused})
            return
        self._handle(comm, request, off_thread=True)

    def _handle(self, comm: Any, data: dict[str, Any], off_thread: bool) -> None:
        self._heard_on(comm)
        kind = data.get("type")
        if kind == "hello":
            self.push_state(self.session.stats(), force=True)
        elif kind == "set_mode":
            self._set_mode(data.get("mode"), off_thread)
        elif kind == "set_precision":
            self._set_precision(data.get("precision"), off_thread)
        elif kind == "monitor":
            self._panel.set_open(bool(data.get("open")))
        elif kind == "graph":
            from tpunb.monitoring.widget import graph_answer

            answer = graph_answer(self.session.group_graph, str(data.get("key")))
            self.send({"type": "graph", **answer})
        else:
            self.send({"type": "error", "message": f"tpunb: unknown request {kind!r}"})

    def _set_mode(self, name: Any, off_thread: bool) -> None:
        try:
            self.session.request_default(ModeConfig.build(name), source="lab", off_thread=off_thread)
        except (ModeError, ModeUnavailable) as error:
            self.send({"type": "error", "message": str(error)})
        self._after_request(off_thread)

    def _set_precision(self, name: Any, off_thread: bool) -> None:
        try:
            self.session.request_precision(parse_precision(name), off_thread=off_thread)
        except PrecisionError as error:
            self.send({"type": "error", "message": str(error)})
        self._after_request(off_thread)

    def _after_request(self, off_thread: bool) -> None:
        """Tell the pages; a request kept on the control thread is also handed to the notebook
        thread, which applies it at once if no cell runs there. The page sends on control
        while it sees a cell running, and it sees that until the cell's reply arrives: a
        pick made in that moment waited for the next cell, however long that took."""
        self.push_state(self.session.stats(), force=True)
        if off_thread and self._control is not None:
            self._control.on_notebook_thread(self._apply_between_cells)

    def _apply_between_cells(self) -> None:
        if self.session.apply_pending_between_cells():
            self.push_state(self.session.stats(), force=True)


class PanelFeed:
    """The extension's side panel: one more sink of the sampler, so it ticks exactly like the
    notebook's monitor widget."""

    def __init__(self, link: LabLink) -> None:
        self.link = link
        self.open = False

    def set_open(self, open_: bool) -> None:
        from tpunb.monitoring.widget import VIEW_CSS, VIEW_ESM

        self.open = open_
        if not open_:
            return
        self.link.send({"type": "monitor_view", "esm": VIEW_ESM.read_text(), "css": VIEW_CSS.read_text()})
        sampler = sampler_for(self.link.session)
        self.push(sampler.snapshot())
        sampler.attach(self)

    def push(self, tick: Tick) -> None:
        if tick.monitor_changed:
            self.link.send({"type": "monitor", "state": tick.monitor})

    def wanted(self) -> bool:
        return self.open and self.link.comm_count > 0


_link: LabLink | None = None


def open_lab_link(session: Session, version: str, kernel: Any = None) -> LabLink:
    """The kernel's one link (``%load_ext`` again reuses it and re-announces the state);
    ``kernel`` (ipykernel's) lets pages reach it over the control channel too."""
    global _link
    if _link is None or _link.session is not session:
        _link = LabLink(session, version, kernel)
        _link.open()
    elif _link.comm_count == 0:
        _link.announce()
    else:
        _link.push_state(session.stats(), force=True)
    return _link


def close_lab_link() -> None:
    global _link
    if _link is not None:
        _link.close()
        _link = None
