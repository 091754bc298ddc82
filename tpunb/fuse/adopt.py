"""Adoption: existing parameters, buffers and optimizer state become deferred-capable in place."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def foreach_updates(objects: tuple[Any, ...]) -> Iterator[None]:
    """Optimizers left to choose their implementation (``foreach=None``) use the foreach one
    while the block runs, and choose again afterwards.

    On the CPU PyTorch picks the per-parameter for-loop, about a dozen small ops per parameter
    and step; recorded, each costs the engine's per-op bookkeeping, while the foreach form
    issues a handful of ops per step for all parameters, and compiles to the same fused
    kernels. The numbers agree to float32 rounding (the model suite checks them against
    strict mode). An explicit ``foreach=False`` (or ``fused=True``, ``differentiable=True``)
    is kept.
    """
    switched = []
    for obj in objects:
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        for group in obj.param_groups:
            if (
                "foreach" in group
                and group["foreach"] is None
                and not group.get("fused")
                and not group.get("differentiable")
            ):
                group["foreach"] = True
                switched.append(group)
    try:
        yield
    finally:
        for group in switched:
            group["foreach"] = None
