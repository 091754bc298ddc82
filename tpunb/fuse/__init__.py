"""tpunb's native defer-and-fuse engine (fused mode on CPU and CUDA).

Stages, one module each: ``record`` appends ops to the ``trace`` (the known path for
repeated steps beside new-way recording, which uses ``scan`` for arguments and ``meta`` for
shapes); ``flush`` turns a trace into a group that ran (key, ``plan``, compile, run,
publish); ``cache`` keys groups and holds their variants; ``worker`` compiles them in the
background; ``flush``'s ``replay`` runs an uncompiled group op by op and ``graph`` builds
groups' FX graphs. ``engine`` only wires the
stages and routes each op; ``options`` is what a scope asked for. ``hotcalls`` and
``hotsteps`` take a module called again and again, and its optimizer's step, out of
recording: Dynamo captures them whole (``whole_runs``: the lifecycle the two share) and the
engine's compiler (``compilers``: Inductor here) compiles them. ``deferred`` is the tensor
type; ``wrapper_meta``, ``rng``, ``adopt``, ``errors`` and ``interrupts`` keep metadata, random
streams, adopted tensors, failures and Ctrl-C right; ``workarounds`` holds the patches for
torch's process-wide state.

A walk through these stages, file by file, with a glossary and the thresholds: docs/engine.md.
"""

from tpunb.fuse.deferred import DeferredTensor
from tpunb.fuse.engine import FusionEngine
from tpunb.fuse.errors import FusedOpError
from tpunb.fuse.options import FuseOptions

__all__ = ["DeferredTensor", "FuseOptions", "FusedOpError", "FusionEngine"]
