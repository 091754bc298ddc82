"""JAX ops on TorchTPU tensors: handed to TorchTPU's own ``torch.tpu.pallas.jax_op``.

TorchTPU runs a JAX function on its ``tpu`` tensors itself (the same chip, no copies), given
the function as its own custom op. tpunb registers one per op variant and direction, with a
list-in, list-out signature (``(Tensor[] xs) -> Tensor[]``), the first time a variant meets
``tpu`` tensors, and calls it from inside the tpunb op, so autograd, debug checks and
reporting stay tpunb's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpunb.jaxops.bridge import require_jax

NAMESPACE = "tpunb_tpu"


def on_tpu(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and tensors[0].device.type == "tpu"


def register_with_torchtpu(qualname: str, fn: Callable[..., Any]) -> Any:
    """TorchTPU's custom op running ``fn(*xs)`` (a pytree of arrays) as ``xs -> leaves``."""
    jax = require_jax()
    from torch.tpu import pallas

    def kernel(xs):  # type: ignore[no-untyped-def]  (annotated below, for TorchTPU's schema)
        return jax.tree_util.tree_leaves(fn(*xs))

    # TorchTPU reads the schema from these annotations; real objects, since this module's
    # annotations are strings that name no module-level ``jax``
    kernel.__annotations__ = {"xs": list[jax.Array], "return": list[jax.Array]}
    kernel.__name__ = qualname.split("::")[-1]
    return pallas.jax_op(qualname, kernel)


class TorchTpuOps:
    """One JaxOp's TorchTPU ops, registered on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ops: dict[tuple[int, str], Any] = {}

    def call(
        self, index: int, direction: str, fn: Callable[..., Any], tensors: list[torch.Tensor]
    ) -> list[Any]:
        op = self._ops.get((index, direction))
        if op is None:
            op = self._ops[index, direction] = register_with_torchtpu(
                f"{NAMESPACE}::{self.name}_{index}_{direction}", fn
            )
        return list(op(tensors))
