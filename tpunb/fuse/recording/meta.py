"""Output metadata of an op without running it: meta tensors, cached by signature.

Meta inference is what lets a recorded op hand back a tensor of the right shape, stride and
dtype at once, and it raises shape and dtype errors on the user's line. It costs tens of
microseconds, so results are cached by (op, argument signature); in a loop every call
after the first is a dict lookup.
"""

from __future__ import annotations

from typing import Any

import torch

from tpunb.fuse.recording.trace import TensorMeta


class NotDeferrable(Exception):
    """This call cannot be recorded (no meta kernel, data-dependent shape, non-tensor result)."""


def _meta_tensor(meta: TensorMeta) -> torch.Tensor:
    shape, stride, offset, dtype = meta
    extent = offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True) if size > 0) + 1
    if any(size == 0 for size in shape):
        extent = offset
    return torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)


def _to_meta(value: Any, metas: dict[int, TensorMeta]) -> Any:
    if isinstance(value, torch.Tensor):
        return _meta_tensor(metas[id(value)])
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v, metas) for v in value)
    return value


def _describe_outputs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        if out.layout != torch.strided or out.is_nested:
            raise NotDeferrable(f"returns a {out.layout} tensor")
        if out.is_conj() or out.is_neg():
            # A conjugate or negative view (``_conj``, ``_neg_view``): a DeferredTensor cannot
            # carry the bit, and without it later ops would read the raw, unconjugated values.
            raise NotDeferrable("returns a conjugate or negative view")
        return (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype)
    if isinstance(out, (list, tuple)):  # a list marks several outputs (a TensorMeta is a tuple)
        return [_describe_outputs(o) for o in out]
    if out is None:
        return None
    raise NotDeferrable(f"returns a {type(out).__name__}")


_MISSING = object()

#: Ops whose meta kernel sizes an output other than the op does when it runs: mkldnn's LSTM
#: layer returns an empty workspace on meta and 28 KiB on the CPU, so a recorded forward handed
#: its backward an empty workspace (the backward failed). They run at once, never recorded.
SIZED_WHEN_RUN = frozenset(
    {
        "mkldnn_rnn_layer",
        "mkldnn_rnn_layer_backward",
        "_cudnn_rnn",
        "_cudnn_rnn_backward",
        "miopen_rnn",
        "miopen_rnn_backward",
    }
)


class MetaCache:
    """(op, signature) -> output metadata (a TensorMeta, or a tuple of them)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, Any] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def outputs(
        self,
        key: tuple | None,
        func: torch._ops.OpOverload,
        args: tuple,
        kwargs: dict[str, Any],
        metas: dict[int, TensorMeta],
        has_device_arg: bool,
    ) -> Any:
        """Output metadata for ``func(*args, **kwargs)``; ``metas`` maps id(tensor) -> meta."""
        if key is not None:
            found = self._cache.get(key, _MISSING)
            if found is not _MISSING:  # None is a cached answer too: in-place foreach ops return nothing
                return found
        if func.overloadpacket.__name__ in SIZED_WHEN_RUN:
            raise NotDeferrable("its outputs are sized when it runs (an RNN kernel's workspace)")
        meta_args = _to_meta(args, metas)
        meta_kwargs = {k: _to_meta(v, metas) for k, v in kwargs.items()}
        if has_device_arg:  # factories: make the meta twin, not a real tensor
            meta_kwargs["device"] = torch.device("meta")
        try:
            out = func(*meta_args, **meta_kwargs)
        except Exception as error:  # no meta kernel, data-dependent, or a user error
            raise NotDeferrable(f"{type(error).__name__}: {error}") from error
        try:
            described = _describe_outputs(out)
        except RuntimeError as error:  # e.g. a sparse result has no strides
            raise NotDeferrable(str(error)) from error
        if key is not None:
            self._cache[key] = described
        return described
