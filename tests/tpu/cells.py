"""Notebook cells run in this process's IPython, as a kernel would run them.

The TPU machine has no TCP (a Jupyter kernel cannot start there) and one process holds the
chip at a time, so the hardware suite drives one in-process shell with tpunb loaded; each
cell's printed output (the summary line, tracebacks, tpunb's notes) is captured.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from dataclasses import dataclass
from typing import Any

from IPython.testing.globalipapp import start_ipython


@dataclass
class Ran:
    """What one cell did."""

    output: str  # what the cell printed (its summary line, a traceback, tpunb's notes)
    warned: str  # what went to stderr: warnings
    error: BaseException | None
    seconds: float

    @property
    def summary(self) -> str | None:
        """The ``[tpunb] MODE · ...`` line, if the cell printed one."""
        found = re.search(r"^\[tpunb\] (?:debug|fused|compile|strict)\b.*$", self.output, re.M)
        return found.group(0) if found else None

    @property
    def notes(self) -> list[str]:
        """tpunb's other lines (a failure's explanation, advice)."""
        return [
            line for line in self.output.splitlines() if line.startswith("[tpunb] ") and line != self.summary
        ]


class Cells:
    """One in-process IPython shell with tpunb loaded."""

    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self.shell = start_ipython()
        self.records = [] if records is None else records  # what ``record`` keeps, for a report
        loaded = self.run("%load_ext tpunb")
        assert loaded.error is None, loaded.output

    def run(self, code: str) -> Ran:
        out, err = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = self.shell.run_cell(code, store_history=True)
        seconds = time.perf_counter() - started
        return Ran(out.getvalue(), err.getvalue(), result.error_in_exec or result.error_before_exec, seconds)

    def ok(self, code: str) -> Ran:
        """Run a cell that must not fail."""
        ran = self.run(code)
        assert ran.error is None, f"{type(ran.error).__name__}: {ran.error}\n{ran.output}\n{ran.warned}"
        return ran

    def value(self, expression: str) -> Any:
        return eval(expression, self.shell.user_ns)

    def record(self, **fields: Any) -> None:
        """Keep a figure for the suite's report (TPUNB_TPU_REPORT)."""
        self.records.append(fields)
