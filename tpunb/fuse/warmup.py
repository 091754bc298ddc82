"""Fused mode's one-time set-up, done while the kernel is idle, as soon as the mode is chosen.

The first op a fused scope defers runs a meta kernel, whose dynamo-disable wrapper imports
``torch._dynamo`` (about 1 s here); the first compile imports Inductor. Without this, the
first fused cell after ``%tpu_mode fused`` waits for both even for ``torch.ones(3) + 1``
(the next ones take under 1 ms).

The imports are queued on the kernel's own event loop, so they run on the notebook's thread
between cells, while the user types the next one. Not on a thread of their own: torch._dynamo
and torch._inductor import each other, and the same imports started meanwhile on the
notebook's thread (a compile-mode cell) take their module locks in the other order and fail
with ``_DeadlockError`` (seen in this project's tests). A cell run at once simply starts
after them, as it would have waited for them anyway. Outside a kernel nothing is queued.
"""

from __future__ import annotations

import importlib
import sys

#: In the order a fused cell needs them.
MODULES = ("torch._dynamo", "torch._inductor.compile_fx")
#: How long after the choosing cell the imports start (its output goes out first).
IDLE_DELAY_S = 0.1

_queued = False


def _warm_up() -> None:
    for name in MODULES:
        importlib.import_module(name)


def warm_up_when_idle() -> None:
    """Queue the set-up once per kernel; later calls, and calls outside a kernel, do nothing."""
    global _queued
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if _queued or loop is None:
        return
    _queued = True
    loop.call_later(IDLE_DELAY_S, _warm_up)
