"""One-time imports done while the kernel is idle, before the cell that needs them.

Every mode but strict puts a dispatch mode on the stack, whose dynamo-disable wrapper imports
``torch._dynamo`` at the first op (about 1-3 s here): a first debug cell took 2.7 s for
``torch.log`` of five numbers, then 2 ms. So Dynamo is imported once the extension has
loaded (``LOADED``); the first compile imports Inductor, queued when fused or compile mode is
chosen (``COMPILERS``). Without this, the first fused cell after ``%tpu_mode fused`` waited
for both even for ``torch.ones(3) + 1`` (the next ones take under 1 ms).

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

from tpunb.fuse import config

#: What any tpunb mode's first op needs.
LOADED = ("torch._dynamo",)
#: What fused and compile modes need, in the order a fused cell needs them.
COMPILERS = ("torch._dynamo", "torch._inductor.compile_fx")

_queued: set[str] = set()


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


def import_when_idle(modules: tuple[str, ...] = COMPILERS) -> None:
    """Queue the imports of ``modules`` not queued yet; outside a kernel, do nothing."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    new = tuple(name for name in modules if name not in _queued)
    if not new or loop is None:
        return
    _queued.update(new)
    loop.call_later(config.IDLE_DELAY_S, _import_all, new)
