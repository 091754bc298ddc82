"""Small ops on settled values run at once, unrecorded: what a loop does around its model.

A decode loop, once its model call is compiled whole (hotcalls.py), is left with the
bookkeeping around it: logits processors, ``argmax``, stopping criteria, the next position,
a mask grown by one. About 50 ops a step on a few thousand elements at most. Recorded, each
costs the engine's 10-15 us and every few of them a flush, to save nothing: fused they run
no faster than one by one (3-4 us each). After an outermost hot call the engine's mode
steps aside and such ops never reach the engine (aside.py); where it is on the stack (a
value of the loop is still a tpunb wrapper, the call was not outermost), an op runs as it is
when every tensor it reads is *settled* and small:

* settled: a value the engine has (nothing pending computes or writes it) that is nobody's
  state and no group's result, i.e. a wrapper an eager op made (not an adopted parameter,
  buffer or optimizer state: their updates fuse into a training step; not a group's output:
  the computation it came from goes on recording after a flush), or a plain tensor this
  module, a hot call or another eager path of the engine returned (``mark``, which tags it);
* small: at most ``SMALL_NUMEL`` elements (a batch of logits over a 32k vocabulary).

Its results are plain tensors, tagged as settled, so the loop's next op runs the same way.
Plain tensors from outside the engine (the user's data) are not tagged: ops on them record
as before, so fusing the user's own computations is unchanged. A factory (no tensor
argument: ``torch.arange``, ``torch.full``) runs at once too: its small results are tagged,
big ones become materialized wrappers, as an eager op's results do (a group reads them as
inputs). So does ``torch.tensor(data)`` (``lift_fresh``). The results of a *tiny* group (``tiny``),
which replays op by op and never compiles (plan.py), are settled like an eager op's. Ops
that write an argument, draw random numbers, or are flush boundaries keep their rules
(engine.py, flush.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse import config
from tpunb.fuse.recording.deferred import DeferredTensor

if TYPE_CHECKING:
    from tpunb.fuse.recording.trace import Trace

#: The attribute that tags a plain tensor as settled (set on the tensor object).
TAG = "_tpunb_settled"


#: What ``settled_arguments`` answers: not settled (record as usual), no tensor arguments (a
#: factory: settled if its results are small), settled plain tensors only (run the op on its
#: arguments as they are), settled with wrappers among them (run it on their values).
NOT_SETTLED, NO_TENSORS, PLAIN, WRAPPED = 0, 1, 2, 3


def settled_arguments(args: tuple, kwargs: dict[str, Any], dirty: set[int]) -> int:
    """Whether every tensor argument is small and settled, and whether any is a wrapper.
    Asked of every op first, so it returns at the first argument that is not settled."""
    found = NO_TENSORS
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            kind = _settled(value, dirty)
            if not kind:
                return NOT_SETTLED
            found = max(found, kind)
        elif type(value) in (list, tuple):
            for item in value:
                if isinstance(item, torch.Tensor):
                    kind = _settled(item, dirty)
                    if not kind:
                        return NOT_SETTLED
                    found = max(found, kind)
    return found


def _settled(tensor: torch.Tensor, dirty: set[int]) -> int:
    if type(tensor) is DeferredTensor:
        value = tensor.value
        settled = (
            tensor.pending is None
            and value is not None
            and not tensor.adopted
            and not tensor.from_group
            and value.numel() <= config.SMALL_NUMEL
            and not (dirty and value.untyped_storage().data_ptr() in dirty)
        )
        return WRAPPED if settled else NOT_SETTLED
    return PLAIN if getattr(tensor, TAG, False) and tensor.numel() <= config.SMALL_NUMEL else NOT_SETTLED


def small(value: Any) -> bool:
    """Whether a factory's results (a tensor, or a tuple or list of them) are all small."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    return all(not isinstance(item, torch.Tensor) or item.numel() <= config.SMALL_NUMEL for item in items)


def tiny(trace: Trace) -> bool:
    """Whether a group is too small to repay a compile (plan.py: it never compiles, and its
    results are settled): few ops, and every tensor it reads or makes (intermediates too) small."""
    return (
        len(trace.ops) <= config.TINY_OPS
        and all(tensor.numel() <= config.SMALL_NUMEL for tensor in trace.inputs)
        and all(_small_metas(op.outputs) for op in trace.ops)
    )


def _small_metas(metas: Any) -> bool:
    """Whether recorded output metadata (meta.py: a tensor's, a list of them, or None) is small."""
    if metas is None:
        return True
    if isinstance(metas, list):
        return all(_small_metas(meta) for meta in metas)
    return math.prod(metas[0]) <= config.SMALL_NUMEL


def mark(value: Any) -> Any:
    """Tag the plain tensors in ``value`` (a tensor, a tuple or list of them, an HF output's
    fields) as settled; returns ``value``."""
    if type(value) is torch.Tensor:  # (the usual call's output, every step)
        setattr(value, TAG, True)
        return value
    if isinstance(value, dict):  # transformers' ModelOutput is an OrderedDict
        items = value.values()
    else:
        items = value if isinstance(value, (list, tuple)) else (value,)
    for item in items:
        if type(item) is torch.Tensor:
            setattr(item, TAG, True)
    return value


def settled_read(tensor: Any, dirty: set[int]) -> torch.Tensor | None:
    """The value ``.item()`` of ``tensor`` reads, when it needs nothing from the trace: a
    plain tensor or a materialized one that no pending op writes (``dirty``: the storages the
    trace writes) and no group computed (an optimizer's step counter). The engine's general
    path would decide the same (bookkeeping, no flush), in a tenth of the time. None otherwise."""
    kind = type(tensor)
    if kind is DeferredTensor:
        if tensor.pending is not None or tensor.from_group:
            return None
        value = tensor.value
    elif kind is torch.Tensor and tensor.layout is torch.strided and not tensor.is_nested:
        value = tensor
    else:
        return None
    if value is None or (dirty and value.untyped_storage().data_ptr() in dirty):
        return None
    return value
