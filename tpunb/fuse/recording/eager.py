"""Ops the engine runs at once instead of recording them (engine.py decides which): ops that
need data, have no meta kernel, write a tensor the engine does not own or span devices, and
small bookkeeping (an optimizer's step counter).

An op that reads or writes what the trace holds pending flushes it first, so the op sees the
values strict mode would; bookkeeping that only touches small plain tensors the trace read
keeps the group going (the trace keeps copies of what it read). Results come back wrapped,
so later in-place ops on them can still be recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpunb.fuse.recording.deferred import DeferredTensor, same_objects, written_argument
from tpunb.fuse.recording.ops import OpFacts
from tpunb.fuse.recording.scan import ArgumentScan, is_argument, run_on_values, tensor_leaves
from tpunb.fuse.recording.trace import Trace, tensor_meta
from tpunb.fuse.recording.wrapper_meta import INPLACE_VIEWS, STORAGE_CHANGING, restride

#: A flush of the engine's trace: (why, whether the host waits for its values).
Flush = Callable[[str, bool], None]


class EagerOps:
    """Runs an op now, after flushing what it depends on; counts it as eager or bookkeeping
    (``counts``, the engine's), and wraps new results on ``device`` with ``wrap``."""

    def __init__(
        self,
        device: torch.device,
        counts: dict[str, int],
        flush: Flush,
        wrap: Callable[[torch.Tensor], DeferredTensor],
    ) -> None:
        self.device, self.counts, self.flush, self.wrap = device, counts, flush, wrap

    def run(
        self,
        trace: Trace,
        func: torch._ops.OpOverload,
        op: OpFacts,
        args: tuple,
        kwargs: dict[str, Any],
        scan: ArgumentScan,
        bookkeeping: bool = False,
        wrap: bool = True,
    ) -> Any:
        """Run ``func`` on real values; ``trace`` is the engine's current one."""
        __tracebackhide__ = True
        self.counts["bookkeeping" if bookkeeping else "eager"] += 1
        if (
            trace.ops
            and (not bookkeeping or scan.hazard(trace, op, args, kwargs) or reads_group_result(op, scan))
            and not (bookkeeping and write_keeps_group(trace, op, args, kwargs, scan))
        ):
            self.flush(op.name, True)
        out = run_on_values(func, args, kwargs)
        if op.name in STORAGE_CHANGING or op.name in INPLACE_VIEWS:
            refresh_metadata(args, kwargs, op)
        out = same_objects(func, args, kwargs, out)
        return self.wrap_new(out, args, kwargs) if wrap else out

    def wrap_new(self, out: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Results of an eager op become materialized wrappers, so later in-place ops on them
        can still be recorded; arguments handed back (in-place results) stay as they are."""
        if isinstance(out, DeferredTensor) or is_argument(out, args, kwargs):
            return out
        if isinstance(out, torch.Tensor):
            # conjugate and negative views stay plain: a wrapper would drop their bit (meta.py)
            plain = (
                out.device != self.device
                or out.layout != torch.strided
                or out.is_nested
                or out.is_conj()
                or out.is_neg()
            )
            return out if plain else self.wrap(out)
        if isinstance(out, (list, tuple)):
            return type(out)(self.wrap_new(o, args, kwargs) for o in out)
        return out


def write_keeps_group(
    trace: Trace, op: OpFacts, args: tuple, kwargs: dict[str, Any], scan: ArgumentScan
) -> bool:
    """A bookkeeping op that writes small plain tensors the trace reads (a position counter)
    can run without ending the group: the trace keeps copies of the values it read."""
    if not op.mutated or reads_group_result(op, scan):
        return False
    for where in op.mutated:
        for target in tensor_leaves(written_argument(args, kwargs, where), plain=True):
            if not trace.keep_read_value(target):
                return False
    return not scan.hazard(trace, op, args, kwargs)


def refresh_metadata(args: tuple, kwargs: dict[str, Any], op: OpFacts) -> None:
    """After an eager op changed a wrapped value's view or storage, match the wrapper."""
    for where in op.mutated:
        for wrapper in tensor_leaves(written_argument(args, kwargs, where)):
            restride(wrapper, tensor_meta(wrapper.value))


def reads_group_result(op: OpFacts, scan: ArgumentScan) -> bool:
    """A value read (``loss.item()``) of a result an earlier group computed. It needs no flush
    (the value is there), but it is where the user's step ends: flushing the ops recorded
    since keeps each group aligned with a step, so the next step's groups repeat the same
    keys. (An optimizer's ``step.item()`` reads a counter no group made: no flush.)"""
    return op.name == "aten._local_scalar_dense" and any(
        getattr(tensor, "from_group", False) for tensor in scan.tensors
    )
