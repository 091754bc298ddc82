"""What a fused cell's compiles cost its training steps, measured without a strict run.

A model's call turns hot and is captured by Dynamo on the notebook's thread, then compiled on
the worker beside the steps that follow, which contend with it for the interpreter's lock: the
first 200-step fused run of the HF Trainer took 7.5-9 s against strict's 2.5 s, with 1.3 s of
it the capture. The steps before the cell's first capture ran as strict mode runs them (or
were recorded), so their median is strict's step; each later step's time over that median is
what compiling cost the cell. The summary line then says how much, even where the user never
ran the cell in strict mode (advice.py's ``fused_compile_cost``).
"""

from __future__ import annotations

import collections
import statistics

#: Steps before the first capture needed for their median to stand for strict's step.
BASELINE_STEPS = 5
#: The last steps before the capture kept for that median: a cell that never captures steps on
#: (a long loop whose compile never pays off), and its steps are not all kept.
BASELINE_WINDOW = 64


class StepClock:
    """Times one optimizer step to the next within a cell, and counts the compile's cost."""

    def __init__(self) -> None:
        #: seconds the steps after a capture took over the steps before it, over all cells
        #: (a counter: the session reports each cell's share)
        self.compile_cost_s = 0.0
        self._last: float | None = None
        self._before: collections.deque[float] = collections.deque(maxlen=BASELINE_WINDOW)
        self._baseline: float | None = None  # the median step before the capture, once captured
        self._captured = False

    def begin_cell(self) -> None:
        self._last, self._baseline, self._captured = None, None, False
        self._before.clear()

    def captured(self) -> None:
        """Dynamo captured a hot call or step in this cell: from now on, steps are compared with
        the ones before (the first capture of the cell fixes the baseline)."""
        if not self._captured:
            self._captured = True
            if len(self._before) >= BASELINE_STEPS:
                self._baseline = statistics.median(self._before)

    def stepped(self, now: float) -> None:
        """An optimizer step starts at ``now`` (perf_counter): the step before it has ended."""
        last, self._last = self._last, now
        if last is None:
            return
        if not self._captured:
            self._before.append(now - last)
        elif self._baseline is not None:
            self.compile_cost_s += max(0.0, now - last - self._baseline)
