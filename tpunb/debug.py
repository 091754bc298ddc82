"""Debug mode's checks: synchronous ops, NaN/Inf origin detection, index bounds.

A TorchDispatchMode sees every aten op below autograd, including backward and optimizer
ops, so one object covers the whole training step. It reports where a NaN or Inf is
*born* (an op whose inputs were clean), not every op it flows through, so intentional
infinities such as ``masked_fill(mask, -inf)`` pass while ``log(0)`` is caught.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tpunb.debug_batch import HOST_READS, Finding, PendingChecks, float_tensors
from tpunb.source import SourceLocation, is_internal_file, locate, location_of

#: Ops whose outputs are uninitialised memory: garbage may look like NaN, so never check them.
UNINITIALISED_OUTPUT_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "set_"}
)
#: Attention kernels return their result first and then bookkeeping that is left unset when
#: not asked for (log-sum-exp without a backward, the debug mask): only the result is checked
#: (on a TPU, generation's attention returned a NaN log-sum-exp beside a clean result).
ATTENTION_OPS = ("_scaled_dot_product_", "_flash_attention_", "_efficient_attention_")


def checked_outputs(func: torch._ops.OpOverload, out: Any) -> Any:
    """The part of an op's outputs whose values mean something to check."""
    if func.overloadpacket.__name__.startswith(ATTENTION_OPS) and isinstance(out, (tuple, list)):
        return out[0]
    return out


#: ``DebugCheckError``'s default: the backward node running now, if any.
_RUNNING_NOW: Any = object()


class DebugCheckError(RuntimeError):
    """A debug-mode check failed; the message names the op, its inputs and the user's line.
    ``backward_of`` is where a backward op's gradient came from (``origin_of``); by default
    that of the op running now."""

    def __init__(
        self,
        op: str,
        problem: str,
        details: Sequence[str],
        where: SourceLocation | None,
        backward_of: tuple[str, SourceLocation | None] | None = _RUNNING_NOW,
    ):
        self.op, self.problem, self.where = op, problem, where
        self.backward_of = backward_origin() if backward_of is _RUNNING_NOW else backward_of
        lines = [f"{op} {problem}"]
        if self.backward_of is not None:
            node, forward = self.backward_of
            lines.append(f"  in {node}, the gradient of the op at {forward or '(no user frame found)'}")
        lines.append(f"  at {where}" if where else "  at (no user frame found)")
        lines.extend(f"  {line}" for line in details)
        super().__init__("\n".join(lines))


_FRAME = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+)')


def backward_origin() -> tuple[str, SourceLocation | None] | None:
    """Inside ``backward()``: the autograd node running (``SqrtBackward0``) and the user's line
    whose forward op created it. A NaN born in backward is reported at ``loss.backward()``,
    which says nothing about which forward op's gradient blew up; the node's forward stack
    (recorded by autograd's anomaly mode, which debug mode turns on) does."""
    return origin_of(torch._C._current_autograd_node())


def origin_of(node: Any) -> tuple[str, SourceLocation | None] | None:
    """An autograd node's name and the user's line of the forward op that made it (None for
    no node: the op ran in the forward)."""
    if node is None:
        return None
    frames = [_FRAME.search(entry) for entry in node.metadata.get("traceback_", [])]
    for found in reversed([f for f in frames if f is not None]):
        if not is_internal_file(found["file"]):
            return node.name(), location_of(found["file"], int(found["line"]))
    return node.name(), None


def op_name(func: torch._ops.OpOverload) -> str:
    """``aten.log`` for ``aten.log.default``: the name users recognise."""
    return str(func.overloadpacket)


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dims = ", ".join(str(d) for d in value.shape)
        return f"{str(value.dtype).removeprefix('torch.')}[{dims}] on {value.device}"
    return repr(value)


def _overflow(out: Any) -> str:
    """What an Inf in a reduced-precision result means: the dtype overflowed (%tpu_precision)."""
    dtypes = {t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
    low = [d for d in (torch.float16, torch.bfloat16) if d in dtypes]
    return _overflow_of(low[0] if low else None)


def _overflow_of(dtype: torch.dtype | None) -> str:
    if dtype is None:
        return ""
    name = str(dtype).removeprefix("torch.")
    return f": a {name} overflow (its largest value is {torch.finfo(dtype).max:.4g})"


def born_here(
    out: tuple[bool, bool], inputs: tuple[bool, bool], allow_nan: bool, allow_inf: bool
) -> tuple[str, str] | None:
    """Whether an op whose outputs hold (NaN, Inf) and inputs (NaN, Inf) gave birth to one the
    mode stops at: the problem in words (without an overflow's note) and the flag allowing it."""
    (out_nan, out_inf), (in_nan, in_inf) = out, inputs
    if out_nan and not in_nan and not allow_nan:
        return "produced NaN from inputs without NaN", "--allow-nan"
    if out_inf and not (in_nan or in_inf) and not allow_inf:
        return "produced Inf from finite inputs", "--allow-inf"
    return None


def _non_finite(tree: Any) -> tuple[bool, bool]:
    """(has NaN, has Inf) over every float tensor and Python float in ``tree``."""
    nan = inf = False
    for leaf in tree_leaves(tree):
        if isinstance(leaf, float):
            nan, inf = nan or math.isnan(leaf), inf or math.isinf(leaf)
    for tensor in float_tensors(tree):
        if bool(torch.isfinite(tensor).all()):
            continue
        nan = nan or bool(torch.isnan(tensor).any())
        inf = inf or bool(torch.isinf(tensor).any())
        if nan and inf:
            break
    return nan, inf


# --- index bounds ---------------------------------------------------------------------------

IndexCheck = tuple[torch.Tensor, int, bool, str]  # (index, size, negatives allowed, what)


def _dim_size(tensor: torch.Tensor, dim: int) -> int:
    return tensor.shape[dim % tensor.dim()] if tensor.dim() else 1


def _advanced_indices(self: torch.Tensor, indices: Sequence[torch.Tensor | None]) -> list[IndexCheck]:
    checks, dim = [], 0
    for index in indices:
        if index is None:
            dim += 1
        elif index.dtype == torch.bool:
            dim += index.dim()
        else:
            checks.append((index, _dim_size(self, dim), True, f"dimension {dim}"))
            dim += 1
    return checks


def _dim_index(args: Sequence[Any]) -> list[IndexCheck]:
    """Ops shaped ``(self, dim, index, ...)``."""
    self, dim, index = args[0], args[1], args[2]
    return [(index, _dim_size(self, dim), False, f"dimension {dim}")]


def _nll_target(args: Sequence[Any]) -> list[IndexCheck]:
    """The targets, ignored ones read as class 0 (always valid): a boolean mask would select
    them with ``nonzero``, which PyTorch/XLA runs on the CPU, a round trip per loss."""
    logits, target, ignore_index = args[0], args[1], args[4]
    classes = logits.shape[1] if logits.dim() >= 2 else logits.shape[0]
    kept = torch.where(target != ignore_index, target, torch.zeros_like(target))
    return [(kept, classes, False, "the class dimension")]


INDEX_CHECKS: dict[str, Callable[[Sequence[Any]], list[IndexCheck]]] = {
    "embedding": lambda a: [(a[1], a[0].shape[0], False, "the embedding table")],
    "take": lambda a: [(a[1], a[0].numel(), True, "the flattened input")],
    "index": lambda a: _advanced_indices(a[0], a[1]),
    "index_put": lambda a: _advanced_indices(a[0], a[1]),
    "index_put_": lambda a: _advanced_indices(a[0], a[1]),
    "_index_put_impl_": lambda a: _advanced_indices(a[0], a[1]),
    "nll_loss_forward": _nll_target,
    "nll_loss2d_forward": _nll_target,
    **{
        name: _dim_index
        for base in (
            "index_select",
            "gather",
            "scatter",
            "scatter_add",
            "scatter_reduce",
            "index_add",
            "index_copy",
            "index_fill",
        )
        for name in (base, base + "_")
    },
}


def bounds_error(func: torch._ops.OpOverload, args: Sequence[Any]) -> DebugCheckError | None:
    """The error for an index-taking op about to read out of bounds (on CUDA that would be a
    device-side assert that kills the context), or None."""
    found = out_of_bounds(func, args)
    if found is None:
        return None
    problem, index = found
    return DebugCheckError(op_name(func), problem, [f"index: {describe_value(index)}"], locate())


def out_of_bounds(func: torch._ops.OpOverload, args: Sequence[Any]) -> tuple[str, torch.Tensor] | None:
    """Which index of an index-taking op is out of bounds, in words, with the index tensor:
    ``index 7 is out of bounds for the embedding table (size 4; valid [0, 4))``."""
    rule = INDEX_CHECKS.get(func.overloadpacket.__name__)
    if rule is None:
        return None
    for index, size, negatives, what in rule(args):
        if not isinstance(index, torch.Tensor) or index.numel() == 0 or index.is_floating_point():
            continue
        low, high = int(index.min()), int(index.max())
        lower = -size if negatives else 0
        bad = low if low < lower else high if high >= size else None
        if bad is not None:
            return f"index {bad} is out of bounds for {what} (size {size}; valid [{lower}, {size}))", index
    return None


# --- the dispatch mode ----------------------------------------------------------------------


class DebugChecks(TorchDispatchMode):
    """Run each op, wait for it, and check its inputs' indices and outputs' values."""

    def __init__(
        self,
        *,
        allow_nan: bool,
        allow_inf: bool,
        synchronize: Callable[[], None] | None,
        deferred: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ):
        """``deferred``: where reading each op's check back costs milliseconds (a TPU), the
        runtime's scope for work it defers; the NaN/Inf checks then gather there and are read
        a few times per step (debug_batch.py). Index bounds are checked before each op as ever."""
        super().__init__()
        self.allow_nan, self.allow_inf = allow_nan, allow_inf
        self._synchronize = synchronize
        self._pending = PendingChecks(deferred) if deferred is not None else None
        self.ops_checked = 0
        self._scopes: list[contextlib.ExitStack] = []

    def __enter__(self) -> DebugChecks:
        # Anomaly mode records each autograd node's forward stack (see ``backward_origin``);
        # its own report of a failed backward would repeat ours, so it is silenced.
        scope = contextlib.ExitStack()
        scope.enter_context(torch.autograd.set_detect_anomaly(True, check_nan=False))
        scope.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Error detected in ")
        self._scopes.append(scope)
        return super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self._scopes.pop().close()
        if self._pending is not None:
            error = self._pending_error()  # read even when the block failed: forget them
            if error is not None and exc_info[1] is None:
                raise error

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # IPython hides this frame; the user's line stays on top
        kwargs = kwargs or {}
        error = bounds_error(func, args)
        if error is not None:
            raise error
        if self._pending is not None:
            return self._checked_later(func, args, kwargs)
        # An in-place op overwrites its input, so look at the inputs before it runs.
        inputs_before = _non_finite((args, kwargs)) if func._schema.is_mutable else None
        out = func(*args, **kwargs)
        if self._synchronize is not None:
            self._synchronize()
        self.ops_checked += 1
        if func.overloadpacket.__name__ not in UNINITIALISED_OUTPUT_OPS:
            error = self._value_error(func, args, kwargs, checked_outputs(func, out), inputs_before)
            if error is not None:
                raise error
        return out

    def _value_error(self, func, args, kwargs, out, inputs_before) -> DebugCheckError | None:
        """The error for a NaN or Inf born in this op (not carried in from its inputs)."""
        if self.allow_nan and self.allow_inf:
            return None
        out_kinds = _non_finite(out)
        if not any(out_kinds):
            return None
        in_kinds = inputs_before if inputs_before is not None else _non_finite((args, kwargs))
        born = born_here(out_kinds, in_kinds, self.allow_nan, self.allow_inf)
        if born is None:
            return None
        problem, hint = born
        if "Inf" in problem:
            problem += _overflow(out)
        return DebugCheckError(op_name(func), problem, [*_described(args, kwargs), _allowing(hint)], locate())

    # --- checks read a few times per step (debug_batch.py) -----------------------------------

    def _checked_later(self, func, args, kwargs):
        __tracebackhide__ = True
        pending = self._pending
        name = func.overloadpacket.__name__
        if name in HOST_READS or _copies_to_host(func, args, kwargs) or pending.full:
            error = self._pending_error()
            if error is not None:
                raise error
        inputs = float_tensors((args, kwargs))
        before = pending.reduce(inputs) if func._schema.is_mutable else None
        out = func(*args, **kwargs)
        self.ops_checked += 1
        if name not in UNINITIALISED_OUTPUT_OPS and not (self.allow_nan and self.allow_inf):
            after = before if before is not None else pending.reduce(inputs)
            pending.note(
                op_name(func), after, checked_outputs(func, out), (args, kwargs), _described(args, kwargs)
            )
        return out

    def _pending_error(self) -> DebugCheckError | None:
        """Read the gathered checks; the error for the first op a NaN or Inf was born in."""
        found = self._pending.read(lambda f: self._born(f) is not None)
        if found is None:
            return None
        problem, hint = self._born(found)
        op = found.op
        if "Inf" in problem:
            problem += _overflow_of(op.reduced_dtype)
        return DebugCheckError(
            op.name, problem, [*op.described, _allowing(hint)], op.where, origin_of(op.node)
        )

    def _born(self, found: Finding) -> tuple[str, str] | None:
        out, inputs = (found.out_nan, found.out_inf), (found.in_nan, found.in_inf)
        return born_here(out, inputs, self.allow_nan, self.allow_inf)


def _described(args: Any, kwargs: Any) -> list[str]:
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return [f"input {i}: {describe_value(t)}" for i, t in enumerate(tensors)]


def _allowing(hint: str) -> str:
    return f"to allow this: %tpu_mode debug {hint}"


def _copies_to_host(func: torch._ops.OpOverload, args: Any, kwargs: Any) -> bool:
    """A copy from the device to the CPU (``.cpu()``, ``.to("cpu")``, ``cpu_tensor.copy_(x)``)."""
    name = func.overloadpacket.__name__
    if name == "_to_copy":
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    if name in ("copy_", "_copy_from"):
        destination, source = args[0], args[1]
        return destination.device.type == "cpu" and source.device.type != "cpu"
    return False
