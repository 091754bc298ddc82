"""The monitor widget: an anywidget (a traitlets class plus one ES module and a stylesheet).

All live data rides in one ``state`` trait, replaced whole each tick, so a tick is one
message. Clicking a fusion group asks the kernel for its graph (``{"type": "graph"}``
message); the answer lands in ``graph``. Frontends without widgets show ``repr``: a text
snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from tpunb.monitoring.sampler import Tick
from tpunb.monitoring.state import format_text

HERE = Path(__file__).parent
#: The view's code; the JupyterLab extension's side panel renders the same module.
VIEW_ESM = HERE / "monitor.js"
VIEW_CSS = HERE / "monitor.css"


def graph_answer(graph_of: Any, key: str) -> dict[str, str]:
    """What a click on a fusion group shows: the code of its compiled graph."""
    code = graph_of(key)
    return {"key": key, "code": code or "no graph kept for this group (not compiled)"}


class MonitorWidget(anywidget.AnyWidget):
    _esm = VIEW_ESM
    _css = VIEW_CSS

    state = traitlets.Dict().tag(sync=True)
    graph = traitlets.Dict().tag(sync=True)  # {"key": ..., "code": ...} for the clicked group

    def __init__(self, graph_of: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._view_count = 0  # let the frontend report how many views show this widget
        self._ever_viewed = False
        self._graph_of = graph_of
        self.on_msg(self._on_message)
        self.observe(self._on_views, names="_view_count")

    def push(self, tick: Tick) -> None:
        if tick.monitor_changed:
            self.state = tick.monitor

    def wanted(self) -> bool:
        """Still worth updating: open, and not closed by every view that once showed it."""
        if self.comm is None:
            return False
        return not (self._ever_viewed and self._view_count == 0)

    def _on_views(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self._ever_viewed = True

    def _on_message(self, widget: Any, content: dict[str, Any], buffers: list[bytes]) -> None:
        if content.get("type") == "graph":
            self.graph = graph_answer(self._graph_of, str(content.get("key")))

    def __repr__(self) -> str:
        return format_text(self.state) if self.state else "tpunb monitor (no data yet)"
