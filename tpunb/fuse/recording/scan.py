"""Reading an op's arguments: the per-op scan that policy decides on, and the encoder
that turns arguments into a trace's refs and float slots."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tpunb.fuse.errors import check_not_failed
from tpunb.fuse.groups.graph import liftable
from tpunb.fuse.recording.deferred import DeferredTensor, written_argument
from tpunb.fuse.recording.ops import OpFacts
from tpunb.fuse.recording.trace import FloatSlot, Ref, Slot, Trace, tensor_meta


class ArgumentScan:
    """One pass over an op's arguments: the meta-cache signature and the facts policy needs."""

    __slots__ = ("all_scalar", "devices", "hashable", "metas", "pending", "tensors", "unsupported", "wrapped")

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.metas: dict[int, tuple] = {}
        self.devices: set[torch.device] = set()  # of tensors with at least one dimension
        self.pending = False
        self.wrapped = False  # any argument is one of the engine's tensors (pending or not)
        self.all_scalar = True
        # a generator argument, a sparse/nested tensor, or a conjugate/negative view: run eagerly
        self.unsupported = False
        self.hashable = True

    def signature(self, value: Any, mask_floats: bool) -> Any:
        if isinstance(value, torch.Tensor):
            if isinstance(value, DeferredTensor):
                self.wrapped = True
                meta = value.meta
                if value.pending is not None or value.error is not None:
                    self.pending = True
            elif value.layout != torch.strided or value.is_nested or value.is_conj() or value.is_neg():
                # conj/neg bits are not in a TensorMeta (nor in a group's key), and compiled code
                # reads the raw memory: an op that gets such a view runs eagerly
                self.unsupported = True
                self.tensors.append(value)
                return id(value)
            else:
                meta = tensor_meta(value)
            self.metas[id(value)] = meta
            self.tensors.append(value)
            if meta[0]:
                self.all_scalar = False
                self.devices.add(value.device)
            return meta
        if type(value) is float:
            return "float" if mask_floats else value
        if isinstance(value, (list, tuple)):
            return tuple([self.signature(v, mask_floats) for v in value])
        if isinstance(value, dict):
            return tuple([(k, self.signature(v, mask_floats)) for k, v in value.items()])
        if isinstance(value, torch.Generator):
            self.unsupported = True
        elif not isinstance(
            value,
            (
                int,
                bool,
                str,
                type(None),
                torch.dtype,
                torch.device,
                torch.layout,
                torch.memory_format,
                complex,
            ),
        ):
            self.hashable = False
        return value

    def writes_real(self, op: OpFacts, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Whether the op writes into a tensor the engine does not own (a plain tensor)."""
        for where in op.mutated:
            for target in tensor_leaves(written_argument(args, kwargs, where), plain=True):
                if not isinstance(target, DeferredTensor):
                    return True
        return False

    def hazard(self, trace: Trace, op: OpFacts, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Whether running this op now, before the trace, could read or write the trace's data."""
        if self.pending or (op.random and trace.has_random):
            return True
        written = set()
        for where in op.mutated:
            for target in tensor_leaves(written_argument(args, kwargs, where), plain=True):
                written.add(id(target))
        for tensor in self.tensors:
            value = tensor.value if isinstance(tensor, DeferredTensor) else tensor
            storage = value.untyped_storage().data_ptr()
            if storage in trace.dirty_storages or (id(tensor) in written and trace.reads_storage(storage)):
                return True
        return False


class ArgumentEncoder:
    """Encodes an op's arguments for the trace: tensors -> refs, floats -> slots."""

    __slots__ = ("first_dtype", "first_ref", "func", "index", "trace")

    def __init__(self, trace: Trace, func: torch._ops.OpOverload, index: int) -> None:
        self.trace, self.func, self.index = trace, func, index
        self.first_ref: Ref | None = None
        self.first_dtype: torch.dtype | None = None

    def encode(self, value: Any, where: int | str, item: int | None = None, depth: int = 0) -> Any:
        """``item`` is the value's place in a list argument; ``depth`` how deep the lists go."""
        if isinstance(value, torch.Tensor):
            ref = self._tensor_ref(value)
            if self.first_ref is None:
                self.first_ref, self.first_dtype = ref, value.dtype
            return ref
        if type(value) is float:
            trace = self.trace
            slot = len(trace.floats)
            trace.floats.append(value)
            can_lift = depth <= 1 and liftable(self.func, where, self._dtype_for_lift())
            trace.float_slots.append(FloatSlot(self.index, where, can_lift, self._dtype_for_lift(), item))
            return Slot(slot)
        if isinstance(value, (list, tuple)):
            return tuple(self.encode(v, where, k, depth + 1) for k, v in enumerate(value))
        return value

    def _dtype_for_lift(self) -> torch.dtype | None:
        return self.first_dtype

    def _tensor_ref(self, value: torch.Tensor) -> tuple:
        if isinstance(value, DeferredTensor):
            check_not_failed(value)
            return value.pending if value.pending is not None else self.trace.input_ref(value.value, True)
        return self.trace.input_ref(value)


def real_values(value: Any) -> Any:
    if isinstance(value, DeferredTensor):
        check_not_failed(value)
        return value.value
    if isinstance(value, (list, tuple)):
        return type(value)(real_values(v) for v in value)
    return value


def run_on_values(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on the real tensors behind its arguments (an op the engine runs eagerly)."""
    return func(*real_values(args), **{k: real_values(v) for k, v in kwargs.items()})


def tensor_leaves(value: Any, plain: bool = False) -> Iterator[Any]:
    """DeferredTensors in a (possibly list) argument; with ``plain``, every tensor."""
    if isinstance(value, DeferredTensor) or (plain and isinstance(value, torch.Tensor)):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensor_leaves(item, plain)


def is_argument(out: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    return any(out is a for a in args) or any(out is v for v in kwargs.values())


def all_scalar(outputs: Any) -> bool:
    if outputs is None:
        return True
    if isinstance(outputs, list):
        return all(all_scalar(o) for o in outputs)
    return not outputs[0]
