"""The live monitor: ``%tpu_monitor`` / ``tpunb.monitor()``.

``widget`` is the anywidget view, ``state`` builds what it shows from the session's snapshot,
``sampler`` is the kernel's one thread that feeds it (and the lab extension) while anyone looks.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from tpunb.monitoring.sampler import Sampler
from tpunb.monitoring.state import format_text
from tpunb.session import Session

_lock = threading.Lock()
_sampler: Sampler | None = None
_widget: Any = None


def sampler_for(session: Session) -> Sampler:
    global _sampler
    with _lock:
        if _sampler is None or _sampler.session is not session:
            _sampler = Sampler(session)
        return _sampler


def has_widget_frontend() -> bool:
    """A kernel (so a frontend may render widgets), as opposed to terminal IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def monitor_widget(session: Session) -> Any:
    """The process's monitor widget (one model; showing it again adds a view), fed live."""
    global _widget
    from tpunb.monitoring.widget import MonitorWidget

    sampler = sampler_for(session)
    with _lock:
        if _widget is None or _widget.comm is None:
            _widget = MonitorWidget(graph_of=session.group_graph)
            _widget.push(sampler.snapshot())
    sampler.attach(_widget)
    return _widget


def text_snapshot(session: Session) -> str:
    return format_text(sampler_for(session).snapshot().monitor)
