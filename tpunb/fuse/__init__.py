"""tpunb's native defer-and-fuse engine (fused mode on CPU and CUDA), and the parts of it the
TorchTPU runtime uses (a trained module compiled whole). One subpackage per stage; docs/engine.md
walks an op and a module call through them, with a glossary and the thresholds.

* The engine and its scope, here: ``engine`` (routes each op, wires the stages), ``options``
  (what a scope asked for), ``config`` (thresholds and limits), ``aside`` (its dispatch mode on
  the stack, stepped aside between hot calls), ``interrupts`` (Ctrl-C between ops), ``ports``
  (what collaborators may use of the engine), ``workarounds`` (torch's process-wide state),
  ``errors`` (what a failure says).
* ``recording/``: ``deferred`` (the tensor type), ``wrapper_meta``, ``ops`` (facts per aten op),
  ``scan`` (reading arguments), ``meta`` (output metadata on meta tensors), ``record`` (the
  known path for repeated steps and new-way recording), ``trace`` (the recording itself),
  ``eager`` (ops run at once), ``settled`` (small ops on settled values), ``growing`` (inputs
  that grow every step), ``adopt`` (parameters and optimizer state made deferred-capable),
  ``rng`` and ``random_fill`` (random streams as eager's).
* ``groups/``: ``flush`` (a trace becomes a group that ran: key, plan, replay or compile),
  ``plan`` (every rule of when to compile), ``cache`` (groups and their variants), ``graph`` (a
  group's FX graph), ``compilers`` (which compiler: Inductor here), ``worker`` (the background
  compile thread), ``disk_cache`` (compiled code across restarts), ``idle_imports`` (Dynamo and
  Inductor imported between cells).
* ``hot/``: ``module_call_hooks`` (the global module hooks), ``hotcalls`` and ``hotcode`` (a
  module called again and again, compiled by architecture), ``hot_backward`` (its backward),
  ``hotsteps`` (its optimizer's step), ``whole_runs`` and ``payoff`` (their shared lifecycle:
  eager until a compile pays off), ``compile_later`` (the captured graph runs while the worker
  compiles it, under the notebook thread's grad mode and autocast: ``thread_modes``),
  ``trained_modules`` (a trained model compiled whole where the runtime fuses by itself:
  TorchTPU; its own call runs while its first compile is pending), ``flops`` (what a compiled
  training graph computes, for the MFU).
"""

from tpunb.fuse.engine import FusionEngine
from tpunb.fuse.errors import FusedOpError
from tpunb.fuse.options import FuseOptions
from tpunb.fuse.recording.deferred import DeferredTensor

__all__ = ["DeferredTensor", "FuseOptions", "FusedOpError", "FusionEngine"]
