"""The record stage: each op becomes one OpRecord in the trace, by one of two paths.

* **The known path** (``Recorder.follow``). Steady loops (training, evaluation, decoding)
  issue the same ops in the same order, step after step. Every flushed group is kept as a
  path of ``Step``s in a trie (``KnownSequences``), much as PyTorch's lazy tensor core reuses
  IR nodes through its TrieCache. While a trace follows a path, an incoming op is only
  *checked* against the next step (same op, arguments wired to the same refs, inputs with
  the recorded metadata, equal constants) and handed the recorded output metadata: no meta
  inference, no argument encoding, no frame walk (the step's OpRecord, source line
  included, goes into the trace as it is).
* **The new path** (``Recorder.record``): meta inference has given the outputs; arguments
  are encoded (tensors to refs, floats to slots) and the user's frame is found.

An op that does not match the next step takes the engine's ordinary dispatch (it may run
eagerly as bookkeeping and leave the trace on its path); once an op is recorded the new
way, the trace has left the known path and records the new way until its flush, which adds
the new suffix to the trie. Following a path never changes an answer: a step matches only
when the new-path recording would have produced the very same OpRecord and metadata.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse import config
from tpunb.fuse.recording.deferred import DeferredTensor, written_argument
from tpunb.fuse.recording.ops import OpFacts, facts_by_id
from tpunb.fuse.recording.rng import default_generator
from tpunb.fuse.recording.scan import ArgumentEncoder, tensor_leaves
from tpunb.fuse.recording.trace import (
    FloatSlot,
    Input,
    Node,
    OpRecord,
    Ref,
    Slot,
    Trace,
    group_input,
    tensor_meta,
)
from tpunb.fuse.recording.wrapper_meta import INPLACE_VIEWS, restride

if TYPE_CHECKING:
    from tpunb.fuse.ports import RecorderEngine


# --- argument patterns: what a step expects in each argument -------------------------------


@dataclass(frozen=True, slots=True)
class Pending:
    """The pending result of an earlier op of the same trace."""

    ref: Ref


@dataclass(frozen=True, slots=True)
class RealInput:
    """A materialized tensor, input ``ref`` of the group, with the metadata it was recorded with."""

    ref: Ref
    shape: tuple
    stride: tuple
    offset: int | None  # None: any (only a view's output depends on where its input starts)
    dtype: torch.dtype
    device: torch.device
    wrapped: bool  # a DeferredTensor (adopted parameter, earlier result) rather than a plain tensor


@dataclass(frozen=True, slots=True)
class Float:
    """A Python float: any value (it is a slot), or exactly ``value`` where it shapes the output."""

    value: float | None


class _Matching:
    """What one match collects, applied only when every argument matched."""

    __slots__ = ("floats", "new_inputs", "trace")

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.floats: list[float] = []
        self.new_inputs: list[tuple[torch.Tensor, bool]] = []

    def fits(self, value: Any, pattern: Any) -> bool:
        kind = type(pattern)
        if kind is Pending:
            return type(value) is DeferredTensor and value.pending == pattern.ref
        if kind is RealInput:
            return self._fits_input(value, pattern)
        if kind is Float:
            if type(value) is not float or (pattern.value is not None and value != pattern.value):
                return False
            self.floats.append(value)
            return True
        if kind is list:
            return (
                type(value) in (list, tuple)
                and len(value) == len(pattern)
                and all(self.fits(v, p) for v, p in zip(value, pattern, strict=True))
            )
        if kind is tuple:  # a sequence of plain constants (sizes, dims)
            return type(value) in (list, tuple) and tuple(value) == pattern
        return type(value) is kind and value == pattern

    def _fits_input(self, value: Any, pattern: RealInput) -> bool:
        if type(value) is DeferredTensor:
            if not pattern.wrapped or value.value is None:
                return False
            if value.pending is not None:  # an input this trace already writes
                return value.pending == pattern.ref
            real, meta = value.value, value.meta
        else:
            if pattern.wrapped or not isinstance(value, torch.Tensor) or value.is_conj() or value.is_neg():
                return False  # a conjugate/negative view runs eagerly (scan.py), never as a step
            real, meta = value, tensor_meta(group_input(value))
        shape, stride, offset, dtype = meta
        if shape != pattern.shape or stride != pattern.stride or dtype is not pattern.dtype:
            return False  # (batches cut from one dataset tensor differ only in their offsets)
        if (pattern.offset is not None and offset != pattern.offset) or real.device != pattern.device:
            return False
        trace = self.trace
        index = trace.input_index(real)
        if index is None:
            index = next((k for k, (t, _) in enumerate(self.new_inputs) if t is real), None)
            if index is None:
                index = len(self.new_inputs)
                self.new_inputs.append((real, pattern.wrapped))
            index += len(trace.inputs)
        return index == pattern.ref.index


#: What following a step whose arguments are all pending results collects: nothing.
NOTHING_NEW = _Matching(Trace())


def _pattern(encoded: Any, op: OpFacts, trace: Trace, floats: list[float]) -> Any:
    """The pattern of one encoded argument (see trace.py for the encoding)."""
    if type(encoded) is Node:
        return Pending(encoded)
    if type(encoded) is Slot:
        return Float(None if op.floats_keep_metadata else floats[encoded.index])
    if type(encoded) is Input:
        index = encoded.index
        tensor, (shape, stride, offset, dtype, _) = trace.inputs[index], trace.input_metas[index]
        offset = offset if any(op.view_returns) else None
        return RealInput(encoded, shape, stride, offset, dtype, tensor.device, trace.input_wrapped[index])
    if type(encoded) is tuple:
        items = [_pattern(e, op, trace, floats) for e in encoded]
        if all(type(i) in (int, bool, str, type(None)) for i in items):
            return tuple(items)
        return items
    return encoded


@dataclass(eq=False, slots=True)
class Step:
    """One known op: its record, what its arguments must be, and what it hands out."""

    record: OpRecord
    op: OpFacts
    args: tuple
    kwargs: dict[str, Any]
    float_slots: tuple[FloatSlot, ...]
    root: Ref | None  # what a view op views into (trace.roots)
    device: torch.device
    default_dtype: torch.dtype | None  # factories: the default dtype their outputs assumed
    next: list[Step] = field(default_factory=list)
    ends: dict[tuple, Any] | None = None  # at a flush point: (input metas, outputs) -> group key

    def match(self, func: Any, args: tuple, kwargs: dict[str, Any], trace: Trace) -> _Matching | None:
        """What following this step takes, or None when the op is not this step."""
        if func is not self.record.func or len(args) != len(self.args):
            return None
        if (kwargs or self.kwargs) and kwargs.keys() != self.kwargs.keys():
            return None
        if self.default_dtype is not None and torch.get_default_dtype() != self.default_dtype:
            return None
        matching = None  # made on the first argument that is more than a pending result
        try:
            for value, pattern in zip(args, self.args, strict=True):
                if type(pattern) is Pending:  # the usual case, checked here without a call
                    if type(value) is not DeferredTensor or value.pending != pattern.ref:
                        return None
                    continue
                if matching is None:
                    matching = _Matching(trace)
                if not matching.fits(value, pattern):
                    return None
            for name, pattern in self.kwargs.items():
                if matching is None:
                    matching = _Matching(trace)
                if not matching.fits(kwargs[name], pattern):
                    return None
        except Exception:  # a sparse or nested tensor has no strides: not this step
            return None
        return matching if matching is not None else NOTHING_NEW


class KnownSequences:
    """The trie of flushed groups' op sequences."""

    def __init__(self) -> None:
        self.first: list[Step] = []
        self.steps = 0

    def successors(self, step: Step | None) -> list[Step]:
        return self.first if step is None else step.next

    def extend(self, trace: Trace) -> Step | None:
        """Add the trace's ops after its known prefix; returns the step it ends at (None when
        the trie started afresh under a trace that had followed it)."""
        if trace.matched == len(trace.ops):  # followed all the way: nothing new (the steady case)
            return trace.at
        if self.steps + len(trace.ops) - trace.matched > config.MAX_STEPS:
            self.first, self.steps = [], 0
            if trace.matched:
                return None  # its prefix belongs to the old trie
        slots: dict[int, list[FloatSlot]] = {}
        for slot in trace.float_slots:
            slots.setdefault(slot.op, []).append(slot)
        parent = trace.at
        for index in range(trace.matched, len(trace.ops)):
            siblings = self.successors(parent)
            if len(siblings) >= (config.MAX_FIRST if parent is None else config.MAX_BRANCHES):
                del siblings[0]  # its subtree goes too (the count of steps stays an upper bound)
            record = trace.ops[index]
            op = facts_by_id(record.key[0])
            step = Step(
                record=record,
                op=op,
                args=tuple(_pattern(a, op, trace, trace.floats) for a in record.args),
                kwargs={k: _pattern(v, op, trace, trace.floats) for k, v in record.kwargs.items()},
                float_slots=tuple(slots.get(index, ())),
                root=trace.roots.get(index),
                device=trace.device,
                default_dtype=torch.get_default_dtype() if op.has_device_arg else None,
            )
            siblings.append(step)
            self.steps += 1
            parent = step
        return parent


# --- the recorder ------------------------------------------------------------------------------

#: ``Recorder.follow``'s answer for an op that is not the next known step.
NOT_FOLLOWED = object()


class Recorder:
    """Appends ops to the engine's current trace, by the known path or the new one."""

    def __init__(self, engine: RecorderEngine, flush: Callable[[str], None]) -> None:
        self.engine = engine
        self.flush = flush
        self.known = KnownSequences()

    def follow(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Record ``func`` as the next step of the trace's known path, if it is one, and
        return its result; ``NOT_FOLLOWED`` when it is not."""
        trace = self.engine.trace
        if trace.matched != len(trace.ops):
            return NOT_FOLLOWED
        for step in self.known.first if trace.at is None else trace.at.next:
            matching = step.match(func, args, kwargs, trace)
            if matching is not None:
                if self.engine.growing.covers(func, step.record.code, step.record.line):
                    return NOT_FOLLOWED  # learnt since this path was recorded: it runs eagerly
                return self._take(step, matching, args, kwargs)
        return NOT_FOLLOWED

    def _take(self, step: Step, matching: _Matching, args: tuple, kwargs: dict[str, Any]) -> Any:
        trace, op, record = self.engine.trace, step.op, step.record
        if op.random and self._note_random(trace, step.device) is not trace:
            # the generator was reseeded since the trace's first random op: the trace was
            # flushed, and this op starts a new one, recorded the new way
            return self.record(record.func, op, args, kwargs, record.outputs, step.device, record.where)
        self.engine.counts["followed"] += 1
        trace.device = step.device
        index = len(trace.ops)
        for tensor, wrapped in matching.new_inputs:
            trace.input_ref(tensor, wrapped)
        if matching.floats:
            trace.floats.extend(matching.floats)
            trace.float_slots.extend(step.float_slots)
        trace.ops.append(record)
        trace.matched, trace.at = index + 1, step
        trace.has_random = trace.has_random or op.random
        if step.root is not None:
            trace.roots[index] = step.root
        return self._finish(op, record, args, kwargs, index, step.device)

    def record(
        self,
        func: Any,
        op: OpFacts,
        args: tuple,
        kwargs: dict[str, Any],
        outputs: Any,
        device: torch.device,
        where: tuple[CodeType | None, int],
    ) -> Any:
        """Record an op the new way: ``outputs`` is its output metadata from meta inference,
        ``where`` the code and line of the user's frame that issued it."""
        self.engine.counts["recorded"] += 1
        trace = self.engine.trace
        if trace.device is not None and trace.device != device:
            self.flush("device change")
            trace = self.engine.trace
        trace.device = device
        if op.random:
            trace = self._note_random(trace, device)
        index = len(trace.ops)
        encoder = ArgumentEncoder(trace, func, index)
        encode = encoder.encode
        enc_args = tuple([encode(a, position) for position, a in enumerate(args)])
        enc_kwargs = {k: encode(v, k) for k, v in kwargs.items()}
        code, line = where
        key = (op.id, enc_args, tuple(enc_kwargs.items()))
        record = OpRecord(func, enc_args, enc_kwargs, isinstance(outputs, list), code, line, key, outputs)
        # One append commits the op, so an interrupt (KeyboardInterrupt) never leaves half an op.
        trace.ops.append(record)
        trace.has_random = trace.has_random or op.random
        if any(op.view_returns) and encoder.first_ref is not None:
            trace.roots[index] = encoder.first_ref
        return self._finish(op, record, args, kwargs, index, device)

    def _note_random(self, trace: Trace, device: torch.device) -> Trace:
        """Random ops draw when the group runs, with the generator state of the trace's first
        one; a reseed between two of them ends the trace. Returns the trace to record into."""
        state = default_generator(device).get_state()
        if trace.rng_state is not None and not torch.equal(state, trace.rng_state):
            self.flush("RNG state changed")
            trace = self.engine.trace
            trace.device = device
        if trace.rng_state is None:
            trace.rng_state = state
        return trace

    def _finish(
        self, op: OpFacts, record: OpRecord, args: tuple, kwargs: dict, index: int, device: torch.device
    ) -> Any:
        """What both paths do after the append: note writes, hand out results, bound the trace."""
        for where in op.mutated:
            for target in tensor_leaves(written_argument(args, kwargs, where)):
                self._mark_written(target)
        outputs = record.outputs
        if not record.multi_output and outputs is not None and op.return_aliases[0] is None:
            result = self._new_pending(outputs, device, Node(index))  # the usual case
        else:
            result = self._results(op, args, kwargs, outputs, index, record.multi_output, device)
        if op.name in INPLACE_VIEWS:
            restride(args[0], outputs)
        if index + 1 >= self.engine.options.max_ops:
            self.flush(f"max_ops={self.engine.options.max_ops}")
        return result

    def _mark_written(self, wrapper: DeferredTensor) -> None:
        trace = self.engine.trace
        if wrapper.pending is None:  # a materialized input now has pending writes
            wrapper.pending = trace.input_ref(wrapper.value, True)
            trace.touched.append(weakref.ref(wrapper))
        trace.mark_written(wrapper.pending)

    def _results(self, op, args, kwargs, outputs, index, multi, device) -> Any:
        if outputs is None:
            return None
        if not multi:
            if op.return_aliases and op.return_aliases[0] is not None:
                return written_argument(args, kwargs, op.return_aliases[0])
            return self._new_pending(outputs, device, Node(index))
        aliases = op.return_aliases if len(op.return_aliases) == len(outputs) else ()
        results = []
        for k, meta in enumerate(outputs):
            alias = aliases[k] if aliases else None
            if alias is not None:
                results.append(written_argument(args, kwargs, alias))
            elif meta is None:
                results.append(None)
            else:
                results.append(self._new_pending(meta, device, Node(index, k)))
        return results if len(op.return_aliases) == 1 else tuple(results)

    def _new_pending(self, meta: tuple, device: torch.device, ref: Node) -> DeferredTensor:
        wrapper = DeferredTensor.__new__(DeferredTensor, meta, device, self.engine, pending=ref)
        self.engine.trace.touched.append(weakref.ref(wrapper))
        return wrapper
