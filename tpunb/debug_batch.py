"""Debug mode's NaN/Inf checks gathered into few device reads, for devices where a read costs
milliseconds.

On a TPU v5e, reading one flag back (``bool(torch.isfinite(t).all())``) took 5.3 ms: checked
one op at a time, the 336 ops of a small GPT-2 step cost 1.7 s against the step's 45 ms in
strict mode. Here each op's floating-point outputs, and the inputs not seen since they were
last written, get one reduction (their largest magnitude: NaN where any element is NaN, Inf
where any is infinite), computed inside the runtime's ``deferred`` scope (TorchTPU's
DEFER_AND_FUSE: a step's reductions fuse into one program, compiled once) and kept on the
device. They are read together before the host reads a value (``.item()``, a copy to the
CPU), when many are pending, and when the scope ends; the first op whose outputs hold a NaN or
Inf its inputs did not is reported with its op, its inputs and the line that ran it.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from tpunb.source import SourceLocation, locate

#: Pending reductions that force a read: bounds the device memory they hold (4 bytes each,
#: plus whatever values they keep alive until read).
MOST_PENDING = 8192

#: Ops that hand a value to the host: the pending checks are read first, so that a NaN born
#: earlier is reported before the code that reads it can act on it.
HOST_READS = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "item"})


@dataclass
class PendingOp:
    """One checked op: what to name it by, and where its values sit in the pending list."""

    name: str
    where: SourceLocation | None
    node: Any  # the autograd node running when it ran (backward), or None
    inputs: list[int]
    outputs: list[int]
    described: list[str]  # its tensor inputs, described for the error
    reduced_dtype: torch.dtype | None  # a float16/bfloat16 output (an Inf there is an overflow)
    scalars: tuple[bool, bool]  # (a NaN, an Inf) among its Python-number arguments


@dataclass
class Finding:
    """The op a NaN or Inf was born in, with what its inputs and outputs held."""

    op: PendingOp
    out_nan: bool
    out_inf: bool
    in_nan: bool
    in_inf: bool


@dataclass
class PendingChecks:
    """The reductions recorded since the last read, in op order."""

    deferred: Callable[[], contextlib.AbstractContextManager[Any]]
    values: list[torch.Tensor | float] = field(default_factory=list)  # device tensors, or read (CPU)
    ops: list[PendingOp] = field(default_factory=list)
    #: id(tensor) -> (the tensor, weakly; its version when reduced; its reduction's index). By
    #: id: a tensor's ``==`` is elementwise, which weak-keyed dictionaries would call.
    _known: dict[int, tuple[weakref.ref, int, int]] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return len(self.values) >= MOST_PENDING

    def reduce(self, tensors: list[torch.Tensor], reuse: bool = True) -> list[int]:
        """The indices of ``tensors``' reductions: with ``reuse``, a tensor reduced at its
        present version keeps its reduction; the rest are recorded (deferred). An op's outputs
        are always new values: an in-place op's version is bumped before a dispatch mode sees
        the op, so a version cannot tell its output from its input."""
        indices, fresh = [], []
        for tensor in tensors:
            known = self._known.get(id(tensor)) if reuse else None
            if known is not None and known[0]() is tensor and known[1] == tensor._version:
                indices.append(known[2])
            else:
                indices.append(-1)
                fresh.append(tensor)
        if fresh:
            with self.deferred():  # a CPU tensor's check is read at once: reads cost nothing there
                reduced = [
                    _largest_magnitude(t) if t.device.type != "cpu" else _largest_magnitude(t).item()
                    for t in fresh
                ]
            cursor = iter(reduced)
            for position, index in enumerate(indices):
                if index == -1:
                    tensor = tensors[position]
                    indices[position] = len(self.values)
                    self._known[id(tensor)] = (weakref.ref(tensor), tensor._version, len(self.values))
                    self.values.append(next(cursor))
        return indices

    def note(self, name: str, inputs: list[int], out: Any, arguments: Any, described: list[str]) -> None:
        """Record op ``name``, its inputs' reductions (taken before it ran where it writes into
        them), the Python numbers among its ``arguments`` (``masked_fill(mask, -inf)``'s Inf
        is carried in, not born) and its outputs, reduced now."""
        outputs = float_tensors(out)
        low = next((t.dtype for t in outputs if t.dtype in (torch.float16, torch.bfloat16)), None)
        numbers = [x for x in tree_leaves(arguments) if isinstance(x, float)]
        scalars = (any(math.isnan(x) for x in numbers), any(math.isinf(x) for x in numbers))
        where, node = locate(), torch._C._current_autograd_node()
        reduced = self.reduce(outputs, reuse=False)
        self.ops.append(PendingOp(name, where, node, inputs, reduced, described, low, scalars))

    def read(self, born: Callable[[Finding], bool]) -> Finding | None:
        """Read every pending value in one transfer, forget them, and return the first op whose
        non-finite outputs ``born`` says were born there (not carried in), or None."""
        if not self.values:
            self.ops.clear()
            return None
        values: list[float] = [v if isinstance(v, float) else math.nan for v in self.values]
        on_device: dict[torch.device, list[int]] = {}
        for index, value in enumerate(self.values):
            if not isinstance(value, float):
                on_device.setdefault(value.device, []).append(index)
        for indices in on_device.values():  # one read per device
            with self.deferred():
                stacked = torch.stack([self.values[i] for i in indices])
            for index, read in zip(indices, stacked.cpu().tolist(), strict=True):
                values[index] = read
        ops, self.values, self.ops = self.ops, [], []
        self._known = {}
        for op in ops:
            out_nan, out_inf = _kinds(values, op.outputs)
            if out_nan or out_inf:
                in_nan, in_inf = _kinds(values, op.inputs)
                found = Finding(op, out_nan, out_inf, in_nan or op.scalars[0], in_inf or op.scalars[1])
                if born(found):
                    return found
        return None


def float_tensors(tree: Any) -> list[torch.Tensor]:
    """The floating-point and complex tensors in ``tree`` that hold values."""
    return [
        leaf
        for leaf in tree_leaves(tree)
        if isinstance(leaf, torch.Tensor)
        and (leaf.is_floating_point() or leaf.is_complex())
        and leaf.numel() > 0
        and leaf.device.type != "meta"
    ]


def _largest_magnitude(tensor: torch.Tensor) -> torch.Tensor:
    """max |x| as float32: NaN where any element is NaN (max propagates it), Inf where any is
    infinite. Plain ``abs`` and ``amax``: every backend lowers them."""
    values = torch.view_as_real(tensor.detach()) if tensor.is_complex() else tensor.detach()
    return values.abs().amax().float()


def _kinds(values: list[float], indices: list[int]) -> tuple[bool, bool]:
    """(a NaN among them, an Inf among them); a reduction that is NaN may hide an Inf."""
    picked = [values[i] for i in indices]
    return any(math.isnan(v) for v in picked), any(math.isinf(v) for v in picked)


@contextlib.contextmanager
def nothing_deferred() -> Iterator[None]:
    """The ``deferred`` scope of a runtime that runs every op at once."""
    yield
