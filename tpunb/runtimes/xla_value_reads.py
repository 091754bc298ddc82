"""Fused and compile cells on PyTorch/XLA: a value read runs *everything* pending, as the
native engine does.

torch_xla, asked for one tensor's value (``.item()``, ``if tensor:``, ``.cpu()``, printing),
compiles and runs only the graph that tensor needs. Everything else stays pending and the
next read's graph carries it along, so in a decode loop with a static KV cache each step's
graph holds the cache writes of every step before it: a new graph, and a new compile, at
every token (17 compiles for 16 tokens, measured on the CPU PJRT device; a PEFT training loop
logging ``loss.item()`` in a compile cell, ``torch_xla.compile``: 17 graphs for 16 steps, 7 s a
step where strict takes 51 ms). Syncing all live
tensors first (``torch_xla.sync()``, what ``mark_step`` does) makes each step the same graph,
compiled once, as tpunb's fused mode does on the native runtime, where a materialization
point flushes everything recorded. The graph log lists this file among such a graph's
frames, so its group's trigger says "value read" (xla.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tpunb.value_reads import read_name

#: The graph log lists this file among the frames of a graph that ran for a value read.
THIS_FILE = os.path.abspath(__file__)


class SyncAtValueReads(TorchFunctionMode):
    """Runs ``torch_xla.sync()`` before a value read of an XLA tensor (and of ``.to("cpu")``)."""

    def __init__(self, sync: Any) -> None:
        super().__init__()
        self._sync = sync

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            args
            and isinstance(args[0], torch.Tensor)
            and args[0].device.type == "xla"
            and read_name(func, args, kwargs) is not None
        ):
            self._sync()
        return func(*args, **kwargs)
