"""The lab extension's requests over the kernel's control channel, so they reach tpunb while
cells run.

JupyterLab sends comm messages on the shell channel, which ipykernel serves one message at a
time: during a Run All on a fresh kernel, the page's ``hello`` (sent when ``%load_ext tpunb``
opened the comm) waited behind every queued cell, about 22 s of the quickstart, and the status
bar showed nothing live meanwhile; a mode picked mid-run applied only after the last cell.

ipykernel serves its control channel on a thread of its own, but only the message types it
knows, and it announces "busy" and "idle" for each one, which would flip JupyterLab's kernel
indicator to idle under a running cell. One type escapes both: ``comm_info_request`` is
served on control, and JupyterLab ignores the status of it (jupyter_server's
``untracked_message_types``). So the page sends a request as a comm-info request for the
target ``tpunb`` with the request itself under the key ``tpunb``; this module wraps the
kernel's handler to give that request to tpunb first, on the control thread, and then lets
ipykernel answer as it always does. What tpunb does there only reads state, sends comm
messages (IOPub is thread-safe) or leaves a request for the notebook thread to apply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

#: Where a comm-info request carries tpunb's request (``extension/src/link.ts`` writes it).
REQUEST_KEY = "tpunb"
#: The control message type that carries it.
CARRIER = "comm_info_request"

log = logging.getLogger(__name__)


class ControlRequests:
    """tpunb's hook on one kernel's control channel; ``handle`` gets each request's dict."""

    def __init__(self, kernel: Any, handle: Callable[[dict[str, Any]], None]) -> None:
        self.kernel = kernel
        self.handle = handle
        self._original: Callable[..., Any] | None = None

    @property
    def installed(self) -> bool:
        return self._original is not None

    def install(self) -> bool:
        """Wrap the kernel's comm-info handler; False where this kernel has none to wrap (not
        ipykernel), and the page then keeps to the shell channel."""
        handlers = getattr(self.kernel, "control_handlers", None)
        if not isinstance(handlers, dict) or not callable(handlers.get(CARRIER)):
            return False
        self._original = handlers[CARRIER]
        handlers[CARRIER] = self._serve
        return True

    def uninstall(self) -> None:
        """Give the kernel its own handler back (``%unload_ext``)."""
        if self._original is None:
            return
        handlers = self.kernel.control_handlers
        if handlers.get(CARRIER) == self._serve:
            handlers[CARRIER] = self._original
        self._original = None

    def on_notebook_thread(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the thread that runs cells, once it is free of the message it is
        serving (ipykernel's main event loop; its ``add_callback`` is the one call that may be
        made from another thread)."""
        loop = getattr(self.kernel, "io_loop", None)
        if loop is not None:
            loop.add_callback(work)

    def _serve(self, stream: Any, ident: Any, msg: dict[str, Any]) -> Any:
        request = msg.get("content", {}).get(REQUEST_KEY)
        if isinstance(request, dict):
            try:
                self.handle(request)
            except Exception:  # a page's request must never break the kernel's control channel
                log.exception("tpunb: a request on the control channel failed")
        assert self._original is not None
        return self._original(stream, ident, msg)
