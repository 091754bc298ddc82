"""Keeping a wrapper's own metadata true to its value.

A DeferredTensor has no data, but its shape and strides are real TensorImpl fields that
other code reads. In-place ops that change a tensor's view (``unsqueeze_``, ``t_``) or storage
(``resize_``), and the rare CPU kernel whose output layout differs from its meta kernel's,
would leave them stale; these helpers rewrite them.
"""

from __future__ import annotations

import torch

from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.recording.trace import TensorMeta, tensor_meta

#: In-place ops that change their tensor's view (shape, strides) but not its data: recorded
#: like any op; the wrapper's own metadata is then updated to match.
INPLACE_VIEWS = frozenset(
    f"aten.{name}"
    for name in ("as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_", "swapaxes_")
)
#: In-place ops that replace their tensor's storage: run eagerly, then the wrapper takes the
#: value's new metadata.
STORAGE_CHANGING = frozenset({"aten.resize_", "aten.resize_as_", "aten.set_"})

#: Dispatch keys to skip when rewriting a wrapper's own metadata (so the op reaches ATen's
#: metadata kernel instead of tpunb's dispatch).
PYTHON_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.PythonTLSSnapshot
)


def restride(wrapper: DeferredTensor, meta: TensorMeta) -> None:
    """Give a wrapper new metadata (shape, strides, offset) after its value changed in place.

    The wrapper has no data, so this only rewrites its TensorImpl: ATen's own metadata
    kernels, reached by skipping the Python dispatch keys.
    """
    if meta == wrapper.meta:
        return
    shape, stride, offset, _ = meta
    extent = offset + sum((n - 1) * st for n, st in zip(shape, stride, strict=True) if n > 0) + 1
    with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEYS):
        capacity = torch.Tensor.untyped_storage(wrapper).nbytes() // wrapper.element_size()
        if extent > capacity:
            torch.ops.aten.resize_.default(wrapper, [extent])
        torch.ops.aten.as_strided_.default(wrapper, shape, stride, offset)
    wrapper.meta = meta


def as_recorded(wrapper: DeferredTensor, value: torch.Tensor) -> torch.Tensor:
    """The value with the strides its wrapper promised. A few CPU kernels lay out results
    differently from their meta kernels; later ops were shape-checked against the promise.
    (Where even the shape differs, e.g. batch norm's unused statistics, the wrapper follows.)"""
    shape, stride, _, _ = wrapper.meta
    if tuple(value.shape) != shape:
        restride(wrapper, tensor_meta(value))
        return value
    if value.numel() == 0 or all(
        a == b for size, a, b in zip(shape, value.stride(), stride, strict=True) if size > 1
    ):
        return value
    return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device).copy_(value)
