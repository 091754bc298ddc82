"""JAX and Pallas kernels as PyTorch ops: ``tpunb.jax_op`` and ``tpunb.pallas_call``.

``bridge`` moves tensors across (DLPack), ``op`` makes the custom ops, ``hints`` checks
declared outputs, ``compile_watch`` and ``report`` put JAX's compiles in the monitor.
Importing this package does not import JAX; using it without JAX says how to install it.
"""

from tpunb.jaxops.bridge import JaxUnavailable
from tpunb.jaxops.hints import JaxOpError
from tpunb.jaxops.op import JaxOp, jax_op
from tpunb.jaxops.pallas import pallas_call

__all__ = ["JaxOp", "JaxOpError", "JaxUnavailable", "jax_op", "pallas_call"]
