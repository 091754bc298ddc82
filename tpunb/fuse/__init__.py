"""tpunb's native defer-and-fuse engine (fused mode on CPU and CUDA).

Stages, one module each: ``record`` appends ops to the ``trace`` (the known path for
repeated steps beside new-way recording, which uses ``scan`` for arguments and ``meta`` for
shapes); ``cache`` keys groups and holds their variants; ``worker`` compiles them in the
background; ``graph`` replays them and builds their FX graphs. ``engine`` only wires the
stages (dispatch policy, flush). ``hotcalls`` takes a module called again and again without
grad (generation, evaluation) out of recording: Dynamo compiles it whole. ``deferred`` is the
tensor type; ``views``, ``rng``, ``adopt``, ``errors`` and ``interrupts`` keep metadata,
random streams, adopted tensors, failures and Ctrl-C right; ``workarounds`` holds the
patches for torch's process-wide state.
"""

from tpunb.fuse.deferred import DeferredTensor
from tpunb.fuse.engine import FuseOptions, FusionEngine
from tpunb.fuse.errors import FusedOpError

__all__ = ["DeferredTensor", "FuseOptions", "FusedOpError", "FusionEngine"]
