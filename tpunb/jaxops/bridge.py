"""Tensors across the PyTorch/JAX line, through DLPack: no copies where both sides can
address the same memory.

On the CPU, JAX reads a contiguous torch tensor's memory in place and torch reads JAX's
result buffers in place (``tests/unit/test_jax_op.py`` checks the data pointers). A CUDA
tensor stays on the GPU when this JAX has a GPU backend (``jax[cuda12]``); otherwise it
goes through host memory, and tpunb says so once.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from tpunb.jaxops.hints import JaxOpError

INSTALL_HINT = "pip install 'tpunb[jax]' (or pip install jax)"


class JaxUnavailable(ImportError):
    """JAX is not installed; the message says how to install it."""


@functools.cache
def require_jax() -> Any:
    """The ``jax`` module, or a clear error saying how to get it."""
    try:
        import jax
        import jax.dlpack  # not imported by ``import jax`` on every release
    except ImportError as error:
        raise JaxUnavailable(f"tpunb.jax_op needs JAX, which is not installed: {INSTALL_HINT}") from error
    return jax


@functools.cache
def jax_platforms() -> frozenset[str]:
    return frozenset(device.platform for device in require_jax().devices())


def jax_device_for(tensor: torch.Tensor) -> Any | None:
    """The JAX device that holds ``tensor``'s memory, or None if JAX cannot address it."""
    jax = require_jax()
    if tensor.device.type == "cpu":
        return jax.devices("cpu")[0]
    if tensor.device.type == "cuda" and "gpu" in jax_platforms():
        return jax.devices("gpu")[tensor.device.index or 0]
    return None


#: Where this bridge works: the native runtime's devices (XLA and TorchTPU tensors go through
#: their own bridges).
NATIVE_DEVICES = frozenset({"cpu", "cuda"})


def to_jax(tensor: torch.Tensor) -> Any:
    """A JAX array over ``tensor``'s memory (a contiguous copy first if it is strided)."""
    jax = require_jax()
    if tensor.device.type not in NATIVE_DEVICES:
        raise JaxOpError(
            f"tpunb.jax_op cannot hand {tensor.device.type} tensors to JAX (it runs on cpu, cuda, "
            "xla and tpu tensors); move them to one of those devices first"
        )
    if jax_device_for(tensor) is None:
        _warn_host_copy(tensor.device)
        tensor = tensor.cpu()
    return jax.dlpack.from_dlpack(tensor.detach().contiguous())


def to_torch(array: Any, device: torch.device) -> torch.Tensor:
    """A torch tensor over ``array``'s buffer, on ``device`` (moved there if JAX ran elsewhere)."""
    tensor = torch.from_dlpack(array)
    return tensor if tensor.device == device else tensor.to(device)


@functools.cache
def _warn_host_copy(device: torch.device) -> None:
    warnings.warn(
        f"tpunb.jax_op: this JAX cannot address {device} memory (its devices: "
        f"{', '.join(sorted(jax_platforms()))}), so JAX ops copy their inputs and outputs "
        "through host memory; install a JAX build for that device (pip install 'jax[cuda12]' "
        "for CUDA) to keep them in place",
        RuntimeWarning,
        stacklevel=4,
    )
