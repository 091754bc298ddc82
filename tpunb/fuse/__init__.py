"""tpunb's native defer-and-fuse engine (fused mode on CPU and CUDA).

``engine`` records and flushes; ``deferred`` is the tensor type; ``scan`` reads an op's
arguments; ``trace`` is the recording; ``meta`` shape inference; ``graph`` replay and FX
building; ``cache`` compiled groups; ``views``, ``rng``, ``adopt`` and ``errors`` keep
metadata, random streams, adopted tensors and failures right.
"""

from tpunb.fuse.deferred import DeferredTensor
from tpunb.fuse.engine import FuseOptions, FusionEngine
from tpunb.fuse.errors import FusedOpError

__all__ = ["DeferredTensor", "FuseOptions", "FusedOpError", "FusionEngine"]
