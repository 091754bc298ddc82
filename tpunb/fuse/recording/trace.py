"""The recording: ops, their wired-up arguments, the real tensors they read, float slots.

A Trace is plain data between two flushes. Arguments are stored *encoded*: tensors become
references (``Input(k)`` for the k-th real input, ``Node(op)`` or ``Node(op, k)`` for an
earlier op's output), Python floats become slots (``Slot(s)``) whose values live in
``floats``, and lists become tuples. The encoded ops are at once the cache key's skeleton and
the recipe that replays or compiles the group, so recording, keying and building never
disagree.

A reference is a tagged tuple (``("i", k)``, ``("n", op[, k])``, ``("f", s)``) of its own
type: code names its fields and tells the kinds apart by type, while a key holding thousands
of them hashes and compares at tuple speed (in C), and its text, which the disk cache
digests, is a tuple's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from tpunb.fuse import config


class _Numbered(tuple):
    """A ref that is a kind's tag and a number: ``(TAG, index)``."""

    __slots__ = ()
    TAG = ""

    def __new__(cls, index: int) -> _Numbered:
        return tuple.__new__(cls, (cls.TAG, index))

    def __getnewargs__(self) -> tuple[int]:  # (copy and pickle make it again from its index)
        return (self[1],)

    @property
    def index(self) -> int:
        return self[1]


class Input(_Numbered):
    """The ``index``-th real tensor the group reads."""

    __slots__ = ()
    TAG = "i"


class Slot(_Numbered):
    """The ``index``-th Python float of the trace (``Trace.floats``)."""

    __slots__ = ()
    TAG = "f"


class Node(tuple):
    """The result of recorded op ``op``; output ``out`` of an op that returns several."""

    __slots__ = ()

    def __new__(cls, op: int, out: int | None = None) -> Node:
        return tuple.__new__(cls, ("n", op) if out is None else ("n", op, out))

    def __getnewargs__(self) -> tuple[int, ...]:
        return self[1:]

    @property
    def op(self) -> int:
        return self[1]

    @property
    def out(self) -> int | None:
        return self[2] if len(self) == 3 else None


Ref = Input | Node | Slot
REF_TYPES = (Input, Node, Slot)


def reads(value: Any, ref: Ref) -> bool:
    """Whether an encoded argument (or a tuple of them) is or contains ``ref``."""
    if type(value) is type(ref):
        return value == ref
    return type(value) is tuple and any(reads(item, ref) for item in value)


def resolve(value: Any, lookup: Callable[[Ref], Any]) -> Any:
    """Replace refs in an encoded argument (tuples stand for lists) with ``lookup(ref)``."""
    if type(value) in REF_TYPES:
        return lookup(value)
    if type(value) is tuple:
        return [resolve(v, lookup) for v in value]
    return value


def decoder(
    inputs: Sequence[Any], floats: Sequence[float], env: list[Any], item: Callable[[Node, Any], Any]
) -> Callable[[Ref], Any]:
    """What a ref stands for, against the group's inputs, its float slots and the values of
    the ops run so far (``env``); ``item(ref, value)`` picks output k of a multi-output op."""

    def lookup(ref: Ref) -> Any:
        if type(ref) is Input:
            return inputs[ref.index]
        if type(ref) is Slot:
            return floats[ref.index]
        value = env[ref.op]
        return value if ref.out is None else item(ref, value)

    return lookup


TensorMeta = tuple  # (shape, stride, storage_offset, dtype)


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


@dataclass(slots=True)
class OpRecord:
    """One recorded op: what to call, with which (encoded) arguments, from which line."""

    func: torch._ops.OpOverload
    args: tuple
    kwargs: dict[str, Any]
    multi_output: bool  # the op returns a tuple/list: its outputs are Node(op, k)
    code: CodeType | None  # the user's frame that issued it (code + line, not the frame)
    line: int
    key: tuple  # (func, encoded args, encoded kwargs): this op's part of the group's key
    outputs: Any = None  # the outputs' metadata (meta inference's answer), handed out again on replay

    @property
    def where(self) -> tuple[CodeType | None, int]:
        return self.code, self.line

    def reads(self, ref: Ref) -> bool:
        """Whether ``ref`` is among its arguments."""
        return reads(self.args, ref) or reads(tuple(self.kwargs.values()), ref)


@dataclass(slots=True)
class FloatSlot:
    """A Python float argument: kept in the key while it is constant, lifted once it varies."""

    op: int
    where: int | str  # argument position or kwarg name
    liftable: bool
    dtype: torch.dtype | None  # the dtype the op computes in (what a lifted value is cast to)
    item: int | None = None  # its place in a list argument (a foreach op's scalars), else None

    @property
    def place(self) -> tuple:
        """(op, argument) or, inside a list argument, (op, argument, item)."""
        return (self.op, self.where) if self.item is None else (self.op, self.where, self.item)


def group_input(tensor: torch.Tensor) -> torch.Tensor:
    """What a group reads for a plain tensor: a small non-contiguous one as a contiguous copy.

    A decode loop's model input is ``input_ids[:, -1:]``, a (batch, 1) view whose row stride
    is the history's length: one more every step, so a new key every step for 2 elements.
    Plain tensors are never written inside a group (such writes run eagerly), so reading a
    copy is exact, and the key holds the copy's strides, the same at every step. Only a
    slice is copied, not a permuted tensor: ops on a slice lay their results out as on its
    copy, so the metadata recorded for them holds; on a transpose it would not."""
    if tensor.numel() <= config.KEEP_READ_MAX and not tensor.is_contiguous():
        strides = [stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1]
        if strides == sorted(strides, reverse=True):
            return tensor.contiguous()
    return tensor


@dataclass
class Trace:
    device: torch.device | None = None
    ops: list[OpRecord] = field(default_factory=list)  # appending an op is its one commit point
    inputs: list[torch.Tensor] = field(default_factory=list)
    input_metas: list[tuple] = field(default_factory=list)
    input_versions: list[int] = field(default_factory=list)
    input_wrapped: list[bool] = field(default_factory=list)  # read through a DeferredTensor (not plain)
    input_storages: dict[int, int] = field(default_factory=dict)  # storage ptr -> alias class
    floats: list[float] = field(default_factory=list)
    float_slots: list[FloatSlot] = field(default_factory=list)
    # wrappers whose value this trace decides: new outputs, and inputs written in place
    touched: list[weakref.ref] = field(default_factory=list)
    roots: dict[int, Ref] = field(default_factory=dict)  # view op -> the ref it views into
    dirty_storages: set[int] = field(default_factory=set)  # input storages written in place
    has_random: bool = False
    rng_state: torch.Tensor | None = None  # the generator's state when the first random op was recorded
    # Where the ops follow a known sequence (record.py): the last known step they matched
    # (None: none yet), and how many ops matched before the first new one (all, while on it).
    at: Any = None
    matched: int = 0
    capture_s: float = 0.0  # time the engine spent on this trace's ops (dispatch to record)
    # recorded (at least in part) in a call of a module about to be compiled whole: its groups
    # do not come back once the module's calls are (hotcalls.py), so they are not compiled
    warming: bool = False
    kept: list[torch.Tensor] = field(default_factory=list)  # plain inputs read through a copy
    _input_index: dict[int, int] = field(default_factory=dict)

    def input_ref(self, tensor: torch.Tensor, wrapped: bool = False) -> Ref:
        """The reference for a real tensor read by the group (registered once per object);
        ``wrapped``: it was read through one of the engine's DeferredTensors."""
        index = self._input_index.get(id(tensor))
        if index is None:
            index = len(self.inputs)
            self._input_index[id(tensor)] = index
            if not wrapped:
                self.kept.append(tensor)  # its id stands for the input while the trace lives
                tensor = group_input(tensor)
            storage = tensor.untyped_storage().data_ptr()
            alias_class = self.input_storages.setdefault(storage, len(self.input_storages))
            self.inputs.append(tensor)
            self.input_metas.append((*tensor_meta(tensor), alias_class))
            self.input_versions.append(tensor._version)
            self.input_wrapped.append(wrapped)
        return Input(index)

    def input_index(self, tensor: torch.Tensor) -> int | None:
        return self._input_index.get(id(tensor))

    @property
    def on_known_path(self) -> bool:
        """Whether every op so far matched a known sequence."""
        return self.matched == len(self.ops)

    def root_of(self, ref: Ref) -> Ref:
        """What a ref ultimately views: an input, or the op that made the storage."""
        while type(ref) is Node and ref.op in self.roots:
            ref = self.roots[ref.op]
        return ref

    def mark_written(self, ref: Ref) -> None:
        root = self.root_of(ref)
        if type(root) is Input:
            self.dirty_storages.add(self.inputs[root.index].untyped_storage().data_ptr())

    def key_metas(self) -> tuple:
        """Input metadata for the group's key. Where a read-only input starts in its storage
        does not change the compiled program (Inductor copies an input that arrives less
        aligned than the one it compiled for), so it is left out: samples and batches cut
        from one dataset tensor then share a key. Inputs whose storage the group writes
        keep their exact offset, since overlapping writes change results."""
        metas = []
        for tensor, meta in zip(self.inputs, self.input_metas, strict=True):
            if tensor.untyped_storage().data_ptr() not in self.dirty_storages:
                shape, stride, _, dtype, alias_class = meta
                meta = (shape, stride, "read-only", dtype, alias_class)
            metas.append(meta)
        return tuple(metas)

    def reads_storage(self, storage: int) -> bool:
        return storage in self.input_storages

    def keep_read_value(self, tensor: torch.Tensor) -> bool:
        """Before an eager in-place write to a plain tensor: make the trace read a copy of the
        value it has read so far, so the write does not have to end the group. True when the
        trace does not read the tensor, or now reads the copy; False where a copy would not
        be the same input (a large tensor, a view, a storage read through other tensors too,
        or one the group itself writes): then the write must flush.

        What this is for: bookkeeping counters written between a group's ops, such as HF's
        static KV cache advancing its 0-d ``cumulative_length`` in every layer of every step."""
        storage = tensor.untyped_storage().data_ptr()
        if storage not in self.input_storages:
            return True
        index = self._input_index.get(id(tensor))
        alias_class = self.input_storages[storage]
        if (
            index is None
            or storage in self.dirty_storages
            or tensor.numel() > config.KEEP_READ_MAX
            or tensor.storage_offset() != 0
            or not tensor.is_contiguous()
            or sum(meta[-1] == alias_class for meta in self.input_metas) > 1
        ):
            return False
        copy = tensor.clone()
        del self._input_index[id(tensor)]
        self._input_index[id(copy)] = index
        self.input_storages[copy.untyped_storage().data_ptr()] = self.input_storages.pop(storage)
        self.inputs[index] = copy
        self.input_versions[index] = copy._version
        return True

    def __len__(self) -> int:
        return len(self.ops)
