"""tpunb's native defer-and-fuse engine (fused mode on CPU and CUDA).

``engine`` records and flushes, ``deferred`` is the tensor type, ``trace`` the recording,
``meta`` shape inference, ``graph`` replay and FX building, ``cache`` compiled groups.
"""

from tpunb.fuse.deferred import DeferredTensor
from tpunb.fuse.engine import FusedOpError, FuseOptions, FusionEngine

__all__ = ["DeferredTensor", "FuseOptions", "FusedOpError", "FusionEngine"]
