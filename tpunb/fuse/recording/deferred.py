"""DeferredTensor: a tensor whose value is real or still pending in the fused engine.

A wrapper subclass (no storage of its own): shape, stride and dtype are known at once from
meta inference; ``value`` holds the real tensor once materialized; ``pending`` is its
reference in the engine's trace while its value depends on recorded ops.

Inside a fused scope the engine's dispatch mode sees every op first. Outside one, this
class's ``__torch_dispatch__`` runs ops eagerly on the real values and returns plain
tensors, so a parameter adopted by a fused cell keeps working in strict or debug cells.
Methods that read raw memory without dispatching (``tolist``, ``numpy``, ``data_ptr``,
``repr``, pickling, ...) materialize first: they are flush points.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse.aside import outside_modes
from tpunb.fuse.recording.ops import facts
from tpunb.fuse.recording.trace import Ref, TensorMeta, tensor_meta

if TYPE_CHECKING:
    from tpunb.fuse.ports import WrapperEngine


class DeferredTensor(torch.Tensor):
    value: torch.Tensor | None
    pending: Ref | None
    meta: TensorMeta
    engine: WrapperEngine
    error: BaseException | None
    from_group: bool = False  # its value was computed by a flushed group (not eagerly)
    adopted: bool = False  # a module's parameter or buffer, or optimizer state (adopt.py)

    @staticmethod
    def __new__(
        cls,
        meta: TensorMeta,
        device: torch.device,
        engine: WrapperEngine,
        value: torch.Tensor | None = None,
        pending: Ref | None = None,
    ) -> DeferredTensor:
        shape, stride, offset, dtype = meta
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=stride, storage_offset=offset, dtype=dtype, device=device
        )
        self.value, self.pending, self.meta = value, pending, meta
        self.engine, self.error = engine, None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    @classmethod
    def wrap(cls, value: torch.Tensor, engine: WrapperEngine) -> DeferredTensor:
        """A materialized wrapper around a real tensor (shares its storage)."""
        return cls(tensor_meta(value), value.device, engine, value=value)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached outside a fused scope (the engine's mode comes first inside one), or in one
        # whose mode stepped aside between hot calls: then the op is the engine's (aside.py).
        kwargs = kwargs or {}
        engine = _first_wrapper((args, kwargs)).engine
        if engine.modes.stepped_aside and not _only_values((args, kwargs)):
            try:
                return engine.dispatch(func, args, kwargs)
            finally:
                engine.modes.resume()
        return run_on_values(func, args, kwargs)

    # --- flush points: raw-memory readers -------------------------------------------------

    def materialized(self, reason: str = "materialize") -> torch.Tensor:
        """The real tensor, flushing pending work first. (Not named ``real``: that is the
        real part of a complex tensor, which models read: FNet's ``fftn(x).real``.)"""
        return self.engine.materialize(self, reason)

    def tolist(self) -> Any:
        return self.materialized("tolist()").tolist()

    def numpy(self, *, force: bool = False) -> Any:
        return self.materialized("numpy()").numpy(force=force)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        array = self.materialized("numpy()").numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def data_ptr(self) -> int:
        return self.materialized("data_ptr()").data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.materialized("storage access").untyped_storage()

    def __bool__(self) -> bool:
        # flushed here, not in dispatch, where ``bool()`` reaches us as ``aten._local_scalar_dense``
        # and the monitor would call an ``if`` on a tensor ``.item()``
        self.materialized("bool()")
        return super().__bool__()

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.materialized("cpu()")
        return super().cpu(*args, **kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        value = self.materialized("repr()")
        with outside_modes():  # formatting runs ops: they are not the user's work
            text = repr(value)
        return f"Parameter containing:\n{text}" if getattr(self, "_is_param", False) else text

    def __reduce_ex__(self, protocol: int) -> Any:
        # Pickles (and torch.save) as a plain tensor or Parameter: no tpunb needed to load.
        value = self.materialized("pickling")
        if getattr(self, "_is_param", False):
            return (torch.nn.Parameter, (value, self.requires_grad))
        return value.__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        value = self.materialized("deepcopy")
        with outside_modes():
            value = copy.deepcopy(value, memo)
        if getattr(self, "_is_param", False):
            value = torch.nn.Parameter(value, requires_grad=self.requires_grad)
        memo[id(self)] = value
        return value


def _first_wrapper(value: Any) -> DeferredTensor | None:
    """The first DeferredTensor in an op's arguments (lists, tuples and dicts searched)."""
    if isinstance(value, DeferredTensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        if (found := _first_wrapper(item)) is not None:
            return found
    return None


def _only_values(value: Any) -> bool:
    """Whether every wrapper in an op's arguments is just a value: computed (by a group or at
    once) and not adopted. Between hot calls such an op runs as eager PyTorch and the engine's
    mode stays aside: recording it would only record the loop around the hot calls (a loss on
    their outputs and a batch index flushed with them) op by op (aside.py)."""
    if isinstance(value, DeferredTensor):
        return value.pending is None and value.value is not None and not value.adopted
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return all(_only_values(item) for item in items)


def _values(value: Any, reason: str) -> Any:
    if isinstance(value, DeferredTensor):
        return value.materialized(reason)
    if isinstance(value, (list, tuple)):
        return type(value)(_values(v, reason) for v in value)
    return value


def run_on_values(func: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run ``func`` eagerly on real values. Ops that return one of their (written) arguments
    return that very object, so in-place ops keep the caller's wrapper; new results are plain."""
    reason = str(func.overloadpacket)
    out = func(*_values(args, reason), **{k: _values(v, reason) for k, v in kwargs.items()})
    return same_objects(func, args, kwargs, out)


def written_argument(func_args: tuple, kwargs: dict[str, Any], where: int | str) -> Any:
    return kwargs[where] if isinstance(where, str) else func_args[where]


def same_objects(func: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any], out: Any) -> Any:
    """Swap in the caller's objects for results that *are* written arguments (``add_``, ``out=``)."""
    aliases = facts(func).return_aliases
    if not any(a is not None for a in aliases):
        return out
    if len(aliases) == 1:
        return written_argument(args, kwargs, aliases[0])
    return tuple(
        written_argument(args, kwargs, a) if a is not None else o for a, o in zip(aliases, out, strict=True)
    )
