"""Adoption: existing parameters, buffers and optimizer state become deferred-capable in place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse.deferred import DeferredTensor

if TYPE_CHECKING:
    from tpunb.fuse.engine import FusionEngine


def tensors_of(objects: tuple[Any, ...]) -> Iterator[torch.Tensor]:
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            yield from obj.parameters()
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                yield from group["params"]
            for state in obj.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))
        elif isinstance(obj, torch.Tensor):
            yield obj


def adopt_tensor(tensor: torch.Tensor, engine: FusionEngine) -> int:
    """Swap ``tensor``'s contents for a materialized DeferredTensor (same Python object).

    Returns 1 when adopted, 0 when it stays as it is: already adopted, another device, not a
    leaf, or referenced from C++ (an autograd graph) or weakly, where a swap is refused.
    """
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.device != engine.device:
        return 0
    if not tensor.is_leaf:
        return 0
    wrapper = DeferredTensor.wrap(tensor.detach(), engine)
    if isinstance(tensor, torch.nn.Parameter):
        wrapper._is_param = True
    if tensor.requires_grad:
        wrapper.requires_grad_(True)
    if tensor.grad is not None:
        wrapper.grad = DeferredTensor.wrap(tensor.grad, engine)
    try:
        torch.utils.swap_tensors(tensor, wrapper)
    except RuntimeError:
        return 0
    return 1
