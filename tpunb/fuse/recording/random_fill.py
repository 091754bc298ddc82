"""Random fills of fresh buffers (dropout's mask), in a form Inductor compiles correctly.

Dropout on the CPU records ``mask = empty_like(x); mask.bernoulli_(1 - p); mask.div_(1 - p)``
(feature dropout allocates with ``empty``). With ``fallback_random`` (which keeps compiled
random numbers equal to eager's), Inductor 2.13 runs ``bernoulli_`` as an in-place fallback
kernel but may fuse the mask's readers into a kernel scheduled *before* it: the compiled
group then multiplies by uninitialised memory (NaN after a LayerNorm). So ``build_graph``
turns "allocate, then fill randomly in place" into one functional custom op,
``tpunb::random_fill``, that allocates and fills in eager PyTorch. Its readers depend on its
output, so they run after it; the numbers are the eager kernel's own, from the same
generator state. Fills are chained (each takes the previous one's output as ``after``) so
Inductor cannot reorder them and draw them in a different order than eager did.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

#: Ops that allocate a buffer whose initial contents a random fill overwrites entirely.
FRESH_BUFFERS = frozenset(
    {
        aten.empty_like.default,
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)

#: In-place random fills whose parameters are all floats, by name for the custom op.
FILLS: dict[Any, str] = {
    aten.bernoulli_.float: "bernoulli_.float",
    aten.uniform_.default: "uniform_.default",
    aten.normal_.default: "normal_.default",
    aten.exponential_.default: "exponential_.default",
    aten.log_normal_.default: "log_normal_.default",
    aten.cauchy_.default: "cauchy_.default",
    aten.geometric_.default: "geometric_.default",
}


def _fill_op(name: str) -> torch._ops.OpOverload:
    packet, overload = name.split(".")
    return getattr(getattr(aten, packet), overload)


Tensor = torch.Tensor


@torch.library.custom_op("tpunb::random_fill", mutates_args=())
def random_fill(buffer: Tensor, fill: str, params: list[float], after: Tensor | None) -> Tensor:
    """A new tensor like ``buffer`` (same strides), filled by the in-place random op ``fill``.
    ``after`` only orders this fill after the previous one."""
    out = torch.empty_like(buffer)
    _fill_op(fill)(out, *params)
    return out


@random_fill.register_fake
def _(buffer: Tensor, fill: str, params: list[float], after: Tensor | None) -> Tensor:
    return torch.empty_like(buffer)


#: The op a graph calls (an FX node's target).
RANDOM_FILL = torch.ops.tpunb.random_fill.default


def is_fresh_fill(func: Any, kwargs: dict[str, Any], target_producer: Any) -> bool:
    """Whether an op fills (in place, randomly, with the default generator) a buffer that
    ``target_producer`` just allocated."""
    return func in FILLS and kwargs.get("generator") is None and target_producer in FRESH_BUFFERS
