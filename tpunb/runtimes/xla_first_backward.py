"""PyTorch/XLA: the XLA runtime starts before the process's first backward pass.

Autograd's engine sizes its per-device queues once, at the first backward pass of the
process, from the device counts it sees then; torch_xla reports its devices only once its
PJRT runtime has started. A backward pass on the CPU before the notebook first touches the
XLA device (checking a model on the CPU, then moving it to the TPU) therefore leaves XLA no
queue, and every later XLA backward fails with ``INTERNAL ASSERT FAILED ...
device_ready_queues_`` until the kernel restarts (reproduced with torch_xla 2.8 and 2.9,
with or without tpunb). tpunb does not start the runtime at load, so that a notebook can
still spawn processes (``torch_xla.launch``, ``xmp.spawn``); until it has started, this mode
starts it just before a backward pass. A notebook that spawns after a CPU backward then gets
torch_xla's own "runtime is already initialized" error, which says what to do, instead of a
kernel that can no longer train.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: The calls that run autograd's engine (``torch.autograd.backward`` is reached through
#: ``Tensor.backward``, which is how training loops call it).
BACKWARD_CALLS = (torch.Tensor.backward, torch.autograd.grad)


class StartBeforeFirstBackward(TorchFunctionMode):
    """Calls ``start`` before a backward pass while ``started()`` is false."""

    def __init__(self, start: Callable[[], Any], started: Callable[[], bool]) -> None:
        super().__init__()
        self._start, self._started = start, started

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in BACKWARD_CALLS and not self._started():
            self._start()
        return func(*args, **(kwargs or {}))
