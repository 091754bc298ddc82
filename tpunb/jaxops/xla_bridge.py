"""JAX ops on PyTorch/XLA tensors: the JAX function joins the lazy XLA graph.

``torch_xla``'s ``call_jax`` lowers a jitted JAX function to HLO and splices it into the
graph being traced, so on this runtime a JAX op is part of the fused group (no boundary,
no host round trip) and XLA compiles it with the ops around it; its compile shows up in
the runtime's own group records. ``call_jax`` caches the lowering by the function's
identity, which is why each op variant keeps one jitted function for its lifetime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

#: torch_xla's bridge needs JAX and torchax (torchax imports flax).
XLA_HINT = "pip install 'torch_xla[pallas]' flax"


def on_xla(tensors: Sequence[torch.Tensor]) -> bool:
    return bool(tensors) and tensors[0].device.type == "xla"


def call_on_xla(jitted: Callable[..., Any], args: tuple) -> list[torch.Tensor]:
    """Run ``jitted`` on XLA tensors inside the lazy graph; its outputs, flattened."""
    from torch_xla._internal.jax_workarounds import maybe_get_torchax

    if maybe_get_torchax() is None:
        raise ImportError(f"JAX ops on PyTorch/XLA tensors need torch_xla's JAX bridge: {XLA_HINT}")
    from torch_xla.core import xla_builder

    return list(tree_leaves(xla_builder.call_jax(jitted, args)))
