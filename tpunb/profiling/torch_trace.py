"""``torch.profiler`` over a profiled block: the top ops, the device's spans and the Chrome
trace, with tpunb's own phases added as a lane of their own.

tpunb's phases (a group's capture, compile and run; a compile-mode run) are known from the
event records, timed with the wall clock. The profiler keeps its own clock, so the block runs
inside a ``record_function`` anchor: its start in the trace is the wall time noted just
before, which places every phase on the trace's clock. The trace is Chrome's JSON format
(``traceEvents``), which Perfetto and ``chrome://tracing`` open.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

#: The range around the whole block: the clock anchor, left out of the top ops.
ANCHOR = "tpunb.profile"
#: The lane tpunb's phases go in (a Chrome-trace process id of its own).
TPUNB_PID = "tpunb"
#: Kineto's lowest log level above its "USDT" lines: without it every profile prints
#: ``profiler_start`` and ``profiler_stop`` lines into the cell's output (read when the
#: first profile starts; a user's own setting wins).
QUIET_KINETO = ("KINETO_LOG_LEVEL", "6")


@dataclass(frozen=True)
class Span:
    """A stretch of time on one lane, in seconds from the block's start."""

    lane: str  # "host", "tpunb", "device"
    name: str
    start: float
    seconds: float
    detail: str = ""


class TorchTrace:
    """A ``torch.profiler`` session (CPU, and CUDA where the block runs there).

    ``shapes``: record each op's input shapes. The profiler then holds every tensor an op
    touched weakly, and a tensor held so cannot be swapped in place, which is how the native
    runtime's fused engine adopts parameters and optimizer state (fuse/recording/adopt.py): a fused
    block's optimizer state would stay outside its groups, and the profile would measure a
    slower program than the user runs (measured: a training step split in two groups, one
    of them op by op). So on the native runtime shapes are off unless asked for; its groups
    list their input shapes anyway.
    """

    def __init__(self, cuda: bool, shapes: bool) -> None:
        os.environ.setdefault(*QUIET_KINETO)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._profiler = profile(activities=activities, record_shapes=shapes)
        self._anchor = record_function(ANCHOR)
        self.started_wall = 0.0

    def __enter__(self) -> TorchTrace:
        self._profiler.__enter__()
        self.started_wall = time.time()
        self._anchor.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._anchor.__exit__(None, None, None)
        finally:
            self._profiler.__exit__(None, None, None)

    def top_ops(self, count: int) -> list[dict[str, Any]]:
        """The ops with the most host self time: calls, host and device self time (ms), and
        the input shapes of the costliest call shape."""
        shapes: dict[str, tuple[float, list]] = {}
        for entry in self._profiler.key_averages(group_by_input_shape=True):
            best = shapes.get(entry.key)
            if best is None or entry.self_cpu_time_total > best[0]:
                shapes[entry.key] = (entry.self_cpu_time_total, entry.input_shapes)
        rows = []
        for entry in self._profiler.key_averages():
            if entry.key == ANCHOR:
                continue
            device_us = getattr(entry, "self_device_time_total", 0.0)
            rows.append(
                {
                    "name": entry.key,
                    "calls": entry.count,
                    "host_ms": entry.self_cpu_time_total / 1000,
                    "device_ms": device_us / 1000 if device_us else None,
                    "shapes": [list(s) for s in shapes.get(entry.key, (0, []))[1] if s],
                }
            )
        rows.sort(key=lambda row: -(row["host_ms"] + (row["device_ms"] or 0)))
        return rows[:count]

    def op_seconds(self) -> dict[str, float]:
        """Host self time per op name, in seconds."""
        return {e.key: e.self_cpu_time_total / 1e6 for e in self._profiler.key_averages() if e.key != ANCHOR}

    def device_spans(self) -> list[Span]:
        """The device's kernels and copies, for the timeline (none on a CPU-only run)."""
        events = self._profiler.events() or []
        anchor = next((e for e in events if e.name == ANCHOR), None)
        origin = anchor.time_range.start if anchor is not None else 0
        spans = []
        for event in events:
            if event.device_type == torch.autograd.DeviceType.CUDA:
                start = (event.time_range.start - origin) / 1e6
                spans.append(Span("device", event.name, start, event.time_range.elapsed_us() / 1e6))
        return spans

    def export(self, path: Path, spans: Iterable[Span]) -> Path:
        """Write the Chrome trace to ``path``, with ``spans`` on tpunb's own lane."""
        self._profiler.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        events = trace.setdefault("traceEvents", [])
        anchor = next((e for e in events if e.get("name") == ANCHOR and e.get("ph") == "X"), None)
        origin = float(anchor["ts"]) if anchor is not None else 0.0
        events.append({"ph": "M", "name": "process_name", "pid": TPUNB_PID, "args": {"name": "tpunb"}})
        for span in spans:
            events.append(
                {
                    "ph": "X",
                    "cat": "tpunb",
                    "name": span.name,
                    "pid": TPUNB_PID,
                    "tid": span.lane,
                    "ts": origin + span.start * 1e6,
                    "dur": span.seconds * 1e6,
                    "args": {"detail": span.detail},
                }
            )
        path.write_text(json.dumps(trace))
        return path
