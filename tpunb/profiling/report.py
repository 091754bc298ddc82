"""``Profile``: what a profiled block did and what to fix, as data, text, HTML and a chart.

The same object answers a script (``.findings``, ``.top_ops``...), a terminal or nbval (its
text is its ``repr``) and a notebook (``_repr_html_``, with the timeline as an image).
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Any

from tpunb.profiling.torch_trace import Span


@dataclass
class Profile:
    """A profiled block's report. ``tpunb.profile()`` yields it empty and fills it in when the
    block ends (also when it raises: then ``error`` names the exception)."""

    runtime: str = ""
    device: str = ""
    mode: str = ""
    wall_s: float = 0.0
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    trace_path: str | None = None  # Chrome trace JSON: torch.profiler's events and tpunb's phases
    device_trace: str | None = None  # the runtime's own profiler's directory (PyTorch/XLA)
    spans: list[Span] = field(default_factory=list)
    time_split: dict[str, float] = field(default_factory=dict)  # seconds by part (collect.time_split)
    error: str | None = None
    earlier_compiles_s: float = 0.0  # waited before the block for compiles earlier cells started
    done: bool = False

    def plot(self) -> Any:
        """The timeline (matplotlib ``Figure``): host waits, tpunb's phases, the device's spans."""
        from tpunb.profiling.timeline import timeline

        return timeline(self)

    # --- text --------------------------------------------------------------------------

    def text(self) -> str:
        if not self.done:
            return "tpunb profile: still running (filled in when the block ends)"
        head = f"tpunb profile · {self.mode} · {self.runtime} ({self.device}) · {self.wall_s:.3f} s"
        if self.earlier_compiles_s >= 0.01:
            head += f" (after {self.earlier_compiles_s:.2f} s waiting for earlier cells' compiles)"
        lines = [head + (f" · stopped by {self.error}" if self.error else "")]
        lines += ["", "Findings"]
        lines += [
            f"  {i}. {f['kind']} ({f['seconds'] * 1000:.0f} ms): {f['message']}\n"
            f"     evidence: {f['evidence']}\n     fix: {f['fix']}"
            for i, f in enumerate(self.findings, 1)
        ] or ["  nothing stands out"]
        if self.time_split:
            lines += ["", "Where the time went", _table(self._split_rows(), SPLIT_COLUMNS)]
        lines += [
            "",
            "Top ops (self time)",
            _table(self._op_rows(), ("op", "calls", "host ms", "device ms", "shapes")),
        ]
        if self.groups:
            lines += ["", "Groups and graphs", _table(self._group_rows(), GROUP_COLUMNS)]
        if self.waits:
            lines += ["", "Waits (the host stopped for values)", _table(self._wait_rows(), WAIT_COLUMNS)]
        if self.counters:
            lines += ["", "Runtime counters that moved", _table(self._counter_rows(), ("counter", "change"))]
        if self.trace_path:
            lines += ["", f"Trace: {self.trace_path} (Perfetto: ui.perfetto.dev, or chrome://tracing)"]
        if self.device_trace:
            lines += [f"Device trace: {self.device_trace} (tensorboard --logdir, or xprof --logdir)"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())

    def _split_rows(self) -> list[tuple]:
        """The block's time by part, with each part's share of it (the overlapped worker's too)."""
        wall = self.wall_s or 1.0
        return [(part, f"{s * 1000:.1f}", f"{s / wall:.0%}") for part, s in self.time_split.items()]

    def _op_rows(self) -> list[tuple]:
        return [
            (
                op["name"],
                op["calls"],
                f"{op['host_ms']:.2f}",
                "" if op["device_ms"] is None else f"{op['device_ms']:.2f}",
                " ".join(str(tuple(s)) for s in op["shapes"][:3]),
            )
            for op in self.top_ops
        ]

    def _group_rows(self) -> list[tuple]:
        return [
            (
                g["key"],
                g.get("ops", ""),
                g["status"],
                _ms(g.get("capture_ms")),
                _ms(g.get("compile_ms")),
                _ms(g.get("run_ms")),
                g.get("trigger", ""),
            )
            for g in self.groups
        ]

    def _counter_rows(self) -> list[tuple]:
        return [(name, f"{change:+g}") for name, change in sorted(self.counters.items())]

    def _wait_rows(self) -> list[tuple]:
        return [(w["at"], w["what"], w["count"], f"{w['seconds'] * 1000:.2f}") for w in self.waits]

    # --- HTML ---------------------------------------------------------------------------

    def _repr_html_(self) -> str:
        if not self.done:
            return f"<pre>{html.escape(self.text())}</pre>"
        parts = [f"<div class='tpunb-profile'><b>{html.escape(self.text().splitlines()[0])}</b>"]
        if self.findings:
            items = "".join(
                f"<li><b>{html.escape(f['kind'])}</b> ({f['seconds'] * 1000:.0f} ms): "
                f"{html.escape(f['message'])}"
                f"<br><small>evidence: {html.escape(f['evidence'])}</small>"
                f"<br><small>fix: {html.escape(f['fix'])}</small></li>"
                for f in self.findings
            )
            parts.append(f"<p>Findings</p><ol>{items}</ol>")
        else:
            parts.append("<p>Findings: nothing stands out</p>")
        if self.time_split:
            parts.append(_html_table("Where the time went", SPLIT_COLUMNS, self._split_rows()))
        parts.append(
            _html_table(
                "Top ops (self time)", ("op", "calls", "host ms", "device ms", "shapes"), self._op_rows()
            )
        )
        if self.groups:
            parts.append(_html_table("Groups and graphs", GROUP_COLUMNS, self._group_rows()))
        if self.waits:
            parts.append(_html_table("Waits (the host stopped for values)", WAIT_COLUMNS, self._wait_rows()))
        if self.counters:
            parts.append(
                _html_table("Runtime counters that moved", ("counter", "change"), self._counter_rows())
            )
        if self.spans:
            parts.append(f"<img alt='timeline' src='data:image/png;base64,{self._timeline_png()}'/>")
        if self.trace_path:
            parts.append(
                f"<p><small>Trace: <code>{html.escape(self.trace_path)}</code> "
                "(opens in Perfetto)</small></p>"
            )
        if self.device_trace:
            parts.append(
                f"<p><small>Device trace: <code>{html.escape(self.device_trace)}</code> "
                "(TensorBoard's profile plugin or xprof)</small></p>"
            )
        return "".join(parts) + "</div>"

    def _timeline_png(self) -> str:
        import matplotlib.pyplot as plt

        figure = self.plot()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        plt.close(figure)
        return base64.b64encode(buffer.getvalue()).decode()


GROUP_COLUMNS = ("group", "ops", "status", "capture ms", "compile ms", "run ms", "trigger")
WAIT_COLUMNS = ("line", "what", "count", "total ms")
SPLIT_COLUMNS = ("part", "ms", "of the block")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _table(rows: list[tuple], columns: tuple[str, ...]) -> str:
    if not rows:
        return "  (none)"
    cells = [tuple(str(c) for c in columns), *[tuple(str(c) for c in row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _html_table(title: str, columns: tuple[str, ...], rows: list[tuple]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<p>{html.escape(title)}</p><table><tr>{head}</tr>{body}</table>"
