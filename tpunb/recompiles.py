"""Compile mode's recompiles, in every frame a cell runs, and the storms among them stopped.

A compile-mode cell is more than its own code object: Dynamo compiles every function the
cell calls that it cannot inline (a library's training loop, a ``%run`` script's ``train()``)
and, after each graph break, a *resume function* for the rest of that frame. A value that
changes every step and is guarded in one of them (a step counter, a logged loss, a learning
rate: Python floats and branch conditions are specialised) recompiles that frame at every
step, seconds each. Measured: HF ``Trainer.train()`` in a compile cell spent 42 of its 51 s
recompiling resume functions of ``_maybe_log_save_evaluate`` (guards ``global_step == 1``,
``logs['loss'] == 6.055...``) and Adam's ``lr == 0.001``.

``StormStopper`` watches Dynamo's recompiles while a cell runs (Dynamo's compile-start
callback names each compile ``frame/attempt``). A frame is storming once it recompiles
because the same guard failed again with another value (``lr == 0.1``, then ``lr == 0.05``:
a value that changes every step; shapes that change become dynamic after one recompile, so a
shape guard failing again means the same), or once it has recompiled ``STORM_RECOMPILES``
times for any reasons. Each recompile costs seconds (3 s a graph, cold, on a 2-core CPU), so
the stopper then lowers Dynamo's ``recompile_limit`` to the storming frame's versions for the
rest of the cell: code Dynamo compiled already still runs compiled when its guards pass, and a
frame that would recompile again runs as plain Python instead (Dynamo's own behaviour at its
limit, 8 by default). PyTorch's ``eager_on_recompile`` stance means the same, but Dynamo
reads a stance when a compiled function is entered, so it cannot change inside the running
cell. The limit the user had is back after the cell (Dynamo's config is per thread: this is
the notebook's).
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
_ANY_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
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
            changed.append((code, new, _telling_guard(reasons, len(reasons) - new)))
    return sorted(changed, key=lambda item: -item[1])


def _telling_guard(reasons: list[str], start: int) -> str:
    """The newest of ``reasons[start:]`` that Dynamo had not recorded before: at each recompile
    it records one failure per version it checked, and a version that keeps failing the same
    way (compiled without grad, say) is not why the frame recompiles now."""
    for index in range(len(reasons) - 1, start - 1, -1):
        if reasons[index] not in reasons[:index]:
            return reasons[index]
    return reasons[-1]


def describe_frame(code: CodeType) -> str:
    """``train (script.py:12)``; a resume function as the function and line it resumes."""
    where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    resumed = _RESUME.match(code.co_name)
    if resumed is not None:
        return f"{resumed['name']} after its graph break at line {resumed['line']} ({where})"
    return f"{code.co_name} ({where})"


class StormStopper:
    """While a cell runs: recompiles per frame, and Dynamo's recompile limit lowered once a
    frame storms. One callback for the process, registered with Dynamo on first use; it
    reaches the stopper that is watching now, if any."""

    _watching: ClassVar[StormStopper | None] = None
    _registered: ClassVar[bool] = False

    def __init__(self) -> None:
        self.recompiles: Counter[str] = Counter()
        self.stopped = False
        self._previous: Any = None
        self._failures: dict[CodeType, int] = {}
        self._guards: dict[CodeType, dict[str, str]] = {}  # failed guard → its shape, values as #

    @contextlib.contextmanager
    def watching(self) -> Iterator[StormStopper]:
        _register()
        self._failures = failure_counts()
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
        if self._a_guard_failed_again() or self.recompiles[found[1]] >= STORM_RECOMPILES:
            self._stop(versions=int(found[2]) + 1)  # with the one being compiled now

    def _a_guard_failed_again(self) -> bool:
        """Whether the recompile starting now is for a guard that already caused one of the same
        frame's recompiles in this cell, now with another value (Dynamo records the failed
        guards, one per version it checked, before compiling: a version that keeps failing
        the same way says nothing new)."""
        from torch._dynamo.utils import guard_failures

        again = False
        for code, reasons in list(guard_failures.items()):
            new = set(reasons[self._failures.get(code, 0) :])
            if not new:
                continue
            self._failures[code] = len(reasons)
            seen = self._guards.setdefault(code, {})
            for reason in new - set(seen):
                again = again or _ANY_NUMBER.sub("#", reason) in seen.values()
            seen.update({reason: _ANY_NUMBER.sub("#", reason) for reason in new})
        return again

    def _stop(self, versions: int) -> None:
        from torch._dynamo import config

        self._previous = config.recompile_limit
        config.recompile_limit = min(versions, self._previous)
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
