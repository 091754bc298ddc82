"""Compile mode's recompiles, in every frame a cell runs, and the storms among them stopped.

A compile-mode cell is more than its own code object: Dynamo compiles every function the
cell calls that it cannot inline (a library's training loop, a ``%run`` script's ``train()``)
and, after each graph break, a *resume function* for the rest of that frame. A value that
changes every step and is guarded in one of them (a step counter, a logged loss, a learning
rate: Python floats and branch conditions are specialised) recompiles that frame at every
step, seconds each. Measured: HF ``Trainer.train()`` in a compile cell spent 42 of its 51 s
recompiling resume functions of ``_maybe_log_save_evaluate`` (guards ``global_step == 1``,
``logs['loss'] == 6.055...``) and Adam's ``lr == 0.001``.

``StormStopper`` counts Dynamo's recompiles per frame while a cell runs (Dynamo's
compile-start callback names each compile ``frame/attempt``); once a frame has recompiled
``STORM_RECOMPILES`` times it lowers Dynamo's ``recompile_limit`` to that for the rest of the
cell: code Dynamo compiled already still runs compiled when its guards pass, and a frame that
would recompile again runs as plain Python instead (Dynamo's own behaviour at its limit, 8 by
default). PyTorch's ``eager_on_recompile`` stance means the same, but Dynamo reads a stance
when a compiled function is entered, so it cannot change inside the running cell. The limit
the user had is back after the cell (Dynamo's config is per thread: this is the notebook's).
``frame_recompiles`` names the frames and their last failed guard afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter
from collections.abc import Iterator
from types import CodeType
from typing import Any, ClassVar

#: Recompiles of one frame in one cell after which the rest of the cell stops recompiling
#: (and recompiles of one cell across runs after which tpunb warns: cellcompile.StormWatch).
STORM_RECOMPILES = 4
_COMPILE_ID = re.compile(r"(\d+)/(\d+)")
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")


def failure_counts() -> dict[CodeType, int]:
    """Dynamo's failed guards so far, per code object."""
    from torch._dynamo.utils import guard_failures

    return {code: len(reasons) for code, reasons in list(guard_failures.items())}


def frame_recompiles(before: dict[CodeType, int]) -> list[tuple[CodeType, int, str]]:
    """Frames whose guards failed since ``before``, most failures first: (the frame's code,
    how many, the last failed guard as Dynamo wrote it)."""
    from torch._dynamo.utils import guard_failures

    changed = []
    for code, reasons in list(guard_failures.items()):
        new = len(reasons) - before.get(code, 0)
        if new > 0:
            changed.append((code, new, reasons[-1]))
    return sorted(changed, key=lambda item: -item[1])


def describe_frame(code: CodeType) -> str:
    """``train (script.py:12)``; a resume function as the function and line it resumes."""
    where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    resumed = _RESUME.match(code.co_name)
    if resumed is not None:
        return f"{resumed['name']} after its graph break at line {resumed['line']} ({where})"
    return f"{code.co_name} ({where})"


class StormStopper:
    """While a cell runs: recompiles per frame, and the ``eager_on_recompile`` stance once a
    frame storms. One callback for the process, registered with Dynamo on first use; it
    reaches the stopper that is watching now, if any."""

    _watching: ClassVar[StormStopper | None] = None
    _registered: ClassVar[bool] = False

    def __init__(self) -> None:
        self.recompiles: Counter[str] = Counter()
        self.stopped = False
        self._previous: Any = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[StormStopper]:
        _register()
        StormStopper._watching = self
        try:
            yield self
        finally:
            StormStopper._watching = None
            if self.stopped:
                from torch._dynamo import config

                config.recompile_limit = self._previous

    def on_compile_start(self, compile_id: str) -> None:
        found = _COMPILE_ID.search(compile_id)
        if found is None or found[2] == "0" or self.stopped:
            return
        self.recompiles[found[1]] += 1
        if self.recompiles[found[1]] >= STORM_RECOMPILES:
            self._stop()

    def _stop(self) -> None:
        from torch._dynamo import config

        self._previous = config.recompile_limit
        config.recompile_limit = STORM_RECOMPILES
        self.stopped = True


def _on_compile_start(args: Any) -> None:
    stopper = StormStopper._watching
    if stopper is not None:
        with contextlib.suppress(Exception):  # a failing callback would fail the user's compile
            stopper.on_compile_start(str(getattr(args, "compile_id", "")))


def _register() -> None:
    if StormStopper._registered:
        return
    from torch._dynamo.callback import callback_handler

    callback_handler.register_start_callback(_on_compile_start)
    StormStopper._registered = True
