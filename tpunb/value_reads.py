"""Which tensor calls read values back to the host: where a program waits for its device.

Two parts of tpunb need the same answer: PyTorch/XLA's fused cells sync everything pending
before such a read (runtimes/xla_value_reads.py), and the profiler counts and times these
reads as the cell's waits (profiling/waits.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

#: Tensor methods that read values back to the host, by the name a user knows them by.
VALUE_READS: dict[Any, str] = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.cpu: ".cpu()",
    torch.Tensor.__bool__: "if tensor / bool()",
    torch.Tensor.__int__: "int()",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__index__: "index",
    torch.Tensor.__repr__: "print / repr",
    torch.Tensor.__format__: "print / format",
}


#: Why the fused engine flushed for a read (an op it ran for values, or the method of its
#: tensor that read them), by the name a user knows it by: the monitor's trigger column and
#: the profiler's waits show these words.
ENGINE_READS = {
    "aten._local_scalar_dense": ".item()",
    "aten.is_nonzero": "if tensor / bool()",
    "tolist()": ".tolist()",
    "numpy()": ".numpy()",
    "cpu()": ".cpu()",
    "repr()": "print / repr",
    "bool()": "if tensor / bool()",
}


@functools.lru_cache(maxsize=256)
def flush_reason(reason: str) -> str:
    """A flush reason in the user's words: ``.item()`` for ``aten._local_scalar_dense``, and an
    op that needed values by the name the user called it (``torch.allclose``, not ``aten.allclose``)."""
    said = ENGINE_READS.get(reason)
    if said is not None:
        return said
    name = reason.removeprefix("aten.").split(".")[0]
    if name != reason and hasattr(torch, name):
        return f"torch.{name}"
    if name != reason and hasattr(torch.Tensor, name):
        return f"Tensor.{name}"
    return reason


def read_name(func: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
    """What ``func(*args, **kwargs)`` reads to the host (``".item()"``), or None if it reads nothing."""
    name = VALUE_READS.get(func)
    if name is None and func is torch.Tensor.to and to_host(args[1:], kwargs):
        name = '.to("cpu")'
    return name


def to_host(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(...)``'s arguments name the CPU."""
    for value in (*args, kwargs.get("device")):
        if isinstance(value, (str, torch.device)) and torch.device(value).type == "cpu":
            return True
    return False
