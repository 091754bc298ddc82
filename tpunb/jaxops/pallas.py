"""Pallas kernels that run wherever the notebook runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpunb.jaxops.bridge import require_jax

#: JAX backends with a Pallas compiler (Mosaic on TPU, Triton/Mosaic GPU on GPU).
COMPILED_BACKENDS = frozenset({"tpu", "gpu", "cuda", "rocm"})


def pallas_call(kernel: Callable[..., Any], *, out_shape: Any, interpret: Any = None, **options: Any) -> Any:
    """``jax.experimental.pallas.pallas_call``, interpreted where JAX has no Pallas compiler.

    On a laptop (JAX's CPU backend) Pallas only runs in interpret mode; passing ``interpret``
    explicitly keeps that choice yours. The same kernel then runs compiled on a TPU or GPU.
    """
    from jax.experimental import pallas

    if interpret is None:
        interpret = require_jax().default_backend() not in COMPILED_BACKENDS
    return pallas.pallas_call(kernel, out_shape=out_shape, interpret=interpret, **options)
