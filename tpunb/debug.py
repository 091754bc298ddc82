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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tpunb.source import SourceLocation, is_internal_file, locate, location_of

#: Ops whose outputs are uninitialised memory: garbage may look like NaN, so never check them.
UNINITIALISED_OUTPUT_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "set_"}
)


class DebugCheckError(RuntimeError):
    """A debug-mode check failed; the message names the op, its inputs and the user's line."""

    def __init__(self, op: str, problem: str, details: Sequence[str], where: SourceLocation | None):
        self.op, self.problem, self.where = op, problem, where
        self.backward_of = backward_origin()
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
    node = torch._C._current_autograd_node()
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


def _float_tensors(tree: Any) -> Iterator[torch.Tensor]:
    for leaf in tree_leaves(tree):
        if (
            isinstance(leaf, torch.Tensor)
            and (leaf.is_floating_point() or leaf.is_complex())
            and leaf.numel() > 0
            and leaf.device.type != "meta"
        ):
            yield leaf


def _overflow(out: Any) -> str:
    """What an Inf in a reduced-precision result means: the dtype overflowed (%tpu_precision)."""
    dtypes = {t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
    low = [d for d in (torch.float16, torch.bfloat16) if d in dtypes]
    if not low:
        return ""
    name = str(low[0]).removeprefix("torch.")
    return f": a {name} overflow (its largest value is {torch.finfo(low[0]).max:.4g})"


def _non_finite(tree: Any) -> tuple[bool, bool]:
    """(has NaN, has Inf) over every float tensor and Python float in ``tree``."""
    nan = inf = False
    for leaf in tree_leaves(tree):
        if isinstance(leaf, float):
            nan, inf = nan or math.isnan(leaf), inf or math.isinf(leaf)
    for tensor in _float_tensors(tree):
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

    def __init__(self, *, allow_nan: bool, allow_inf: bool, synchronize: Callable[[], None] | None):
        super().__init__()
        self.allow_nan, self.allow_inf = allow_nan, allow_inf
        self._synchronize = synchronize
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # IPython hides this frame; the user's line stays on top
        kwargs = kwargs or {}
        error = bounds_error(func, args)
        if error is not None:
            raise error
        # An in-place op overwrites its input, so look at the inputs before it runs.
        inputs_before = _non_finite((args, kwargs)) if func._schema.is_mutable else None
        out = func(*args, **kwargs)
        if self._synchronize is not None:
            self._synchronize()
        self.ops_checked += 1
        if func.overloadpacket.__name__ not in UNINITIALISED_OUTPUT_OPS:
            error = self._value_error(func, args, kwargs, out, inputs_before)
            if error is not None:
                raise error
        return out

    def _value_error(self, func, args, kwargs, out, inputs_before) -> DebugCheckError | None:
        """The error for a NaN or Inf born in this op (not carried in from its inputs)."""
        if self.allow_nan and self.allow_inf:
            return None
        out_nan, out_inf = _non_finite(out)
        if not (out_nan or out_inf):
            return None
        in_nan, in_inf = inputs_before if inputs_before is not None else _non_finite((args, kwargs))
        if out_nan and not in_nan and not self.allow_nan:
            problem, hint = "produced NaN from inputs without NaN", "--allow-nan"
        elif out_inf and not (in_nan or in_inf) and not self.allow_inf:
            problem, hint = f"produced Inf from finite inputs{_overflow(out)}", "--allow-inf"
        else:
            return None
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        details = [f"input {i}: {describe_value(t)}" for i, t in enumerate(tensors)]
        details.append(f"to allow this: %tpu_mode debug {hint}")
        return DebugCheckError(op_name(func), problem, details, locate())
