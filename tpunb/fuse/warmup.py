"""Fused mode's one-time set-up, done in the background as soon as the mode is chosen.

The first op a fused scope defers runs a meta kernel, whose dynamo-disable wrapper imports
``torch._dynamo`` (about 1 s here); the first compile imports Inductor. Without this, the
first fused cell after ``%tpu_mode fused`` waits for both even for ``torch.ones(3) + 1``
(the next ones take under 1 ms). Started when fused or compile becomes the default, the
imports are done by the time the user runs the next cell. A cell that starts sooner only
waits for what is left: Python's import lock makes it share the work, not repeat it.
"""

from __future__ import annotations

import threading

THREAD_NAME = "tpunb-warmup"

_started = threading.Event()


def _warm_up() -> None:
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401  (the first compile does)


def warm_up_in_background() -> None:
    """Start the set-up once per process; later calls return at once."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=_warm_up, name=THREAD_NAME, daemon=True).start()
