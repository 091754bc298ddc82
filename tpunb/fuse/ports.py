"""What the engine's collaborators may use of it: one Protocol per kind of collaborator.

The engine (engine.py) hands itself to the objects that work beside it: the wrappers it makes
(deferred.py), the recorder (record.py), and the hot paths that take over from recording
(adopt.py, hotcalls.py, hotsteps.py, hot_backward.py). Each is typed with the Protocol here
that names what it uses, and ``tests/unit/test_fuse_ports.py`` reads their source to hold
them to it. So a newcomer finds in one file what each part can reach, and a new reach into
the engine is a visible change to this file, not a line lost in another.

The flush stage (flush.py) and the eager path (eager.py) get plain values and callables, and
no engine at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from tpunb.fuse.adopt import Adoption
    from tpunb.fuse.aside import ModeStack
    from tpunb.fuse.cache import GraphCache
    from tpunb.fuse.compilers import GraphCompiler
    from tpunb.fuse.deferred import DeferredTensor
    from tpunb.fuse.growing import GrowingInputs
    from tpunb.fuse.hotcalls import HotCalls
    from tpunb.fuse.hotsteps import HotSteps
    from tpunb.fuse.interrupts import InterruptGuard
    from tpunb.fuse.options import FuseOptions
    from tpunb.fuse.trace import Trace


class WrapperEngine(Protocol):
    """What a DeferredTensor uses: an op reaching it outside the engine's mode goes to the
    engine, and its value is the engine's to produce."""

    modes: ModeStack

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any]) -> Any: ...

    def materialize(self, wrapper: DeferredTensor, reason: str) -> torch.Tensor: ...


class RecorderEngine(WrapperEngine, Protocol):
    """What the recorder uses: the trace it appends to (a new one after every flush), the
    limits, the per-op counters, and the inputs seen to grow."""

    trace: Trace
    options: FuseOptions
    counts: dict[str, int]
    growing: GrowingInputs


class HotPathEngine(WrapperEngine, Protocol):
    """What adoption and the hot calls and steps use: they decide, around the recording,
    what is recorded and what runs compiled whole, so they flush, hold interrupts, step the
    mode aside, and count in the cache."""

    device: torch.device
    options: FuseOptions
    trace: Trace
    interrupts: InterruptGuard
    adoption: Adoption
    hot: HotCalls
    hot_steps: HotSteps
    cache: GraphCache
    compiler: GraphCompiler
    publish: Any
    overhead_s: float

    def flush(self, reason: str, wait: bool = False, warming: bool = False) -> None: ...

    def mark_warming(self) -> None: ...
