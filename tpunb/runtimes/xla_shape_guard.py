"""Shape checks torch_xla 2.8 is missing: a mismatched matmul there kills the kernel.

torch_xla 2.8's shape inference for its Dot node (``mm``, ``addmm``, ``mv``, ``dot``, so also
``@``, ``matmul`` and ``F.linear``) ends in an absl CHECK on bad inner dimensions: the process
aborts, in every mode, and the notebook loses its kernel and all its state over a typo.
torch_xla 2.9 raises a RuntimeError instead (measured: the Kaggle image's 2.8.0 aborts on
``ones(1, 3) @ ones(2, 2)``; ``bmm``, ``cat``, ``view``, broadcasting ops and convolutions
raise on both). Where torch_xla is older than 2.9, cells run under :class:`DotShapeGuard`,
which replays just these calls on meta tensors first, so the user gets PyTorch's own error
at their line and the kernel lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

#: The first torch_xla release whose Dot shape errors raise instead of aborting.
RAISES_SINCE = (2, 9)


def _guarded() -> frozenset[Callable[..., Any]]:
    tensor = torch.Tensor
    return frozenset(
        {
            torch.matmul,
            torch.mm,
            torch.addmm,
            torch.mv,
            torch.dot,
            torch.nn.functional.linear,
            tensor.matmul,
            tensor.__matmul__,
            tensor.__rmatmul__,
            tensor.mm,
            tensor.addmm,
            tensor.addmm_,
            tensor.mv,
            tensor.dot,
        }
    )


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    return value


class DotShapeGuard(TorchFunctionMode):
    """Check the shapes of matmul-family calls on meta tensors before torch_xla sees them."""

    def __init__(self) -> None:
        super().__init__()
        self._guarded = _guarded()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self._guarded:
            func(*tree_map(_on_meta, args), **tree_map(_on_meta, kwargs))
        return func(*args, **kwargs)
