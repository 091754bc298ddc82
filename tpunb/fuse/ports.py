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
    from collections import Counter
    from contextlib import AbstractContextManager

    import torch

    from tpunb.fuse.aside import ModeStack
    from tpunb.fuse.groups.cache import GraphCache
    from tpunb.fuse.groups.compilers import GraphCompiler
    from tpunb.fuse.hot.module_call_hooks import ModuleCallHooks
    from tpunb.fuse.hot.step_clock import StepClock
    from tpunb.fuse.interrupts import InterruptGuard
    from tpunb.fuse.options import FuseOptions
    from tpunb.fuse.recording.growing import GrowingInputs
    from tpunb.fuse.recording.trace import Trace


class WrapperEngine(Protocol):
    """What a DeferredTensor uses: an op reaching it outside the engine's mode goes to the
    engine, and its value is the engine's to produce."""

    modes: ModeStack

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any]) -> Any: ...

    def materialize(self, wrapper: torch.Tensor, reason: str) -> torch.Tensor: ...  # a DeferredTensor


class RecorderEngine(WrapperEngine, Protocol):
    """What the recorder uses: the trace it appends to (a new one after every flush), the
    limits, the per-op counters, and the inputs seen to grow."""

    trace: Trace
    options: FuseOptions
    counts: dict[str, int]
    growing: GrowingInputs


class AdoptionPort(Protocol):
    """What the hot calls and steps use of adoption (adopt.py's ``Adoption``)."""

    def on_module_call(self, module: torch.nn.Module) -> None: ...

    def release(self, objects: tuple[Any, ...]) -> int: ...

    def release_stepping(self, optimizer: torch.optim.Optimizer) -> bool: ...

    def step_hook_lifted(self) -> AbstractContextManager[None]: ...


class HotCallsPort(Protocol):
    """What adoption, the hot calls and the hot steps use of the hot calls (hotcalls.py's
    ``HotCalls``)."""

    hooks: ModuleCallHooks

    @property
    def in_call(self) -> bool: ...

    def turn_hot(self, only: torch.nn.Module | None = None) -> None: ...

    def refuse(self, module: torch.nn.Module) -> None: ...


class HotStepsPort(Protocol):
    """What adoption and the hot steps use of the hot steps (hotsteps.py's ``HotSteps``)."""

    def on_plain_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def refuse(self, optimizer: torch.optim.Optimizer, step: Any) -> None: ...  # a HotStep


class HotPathEngine(WrapperEngine, Protocol):
    """What adoption and the hot calls and steps use: they decide, around the recording,
    what is recorded and what runs compiled whole, so they flush, hold interrupts, step the
    mode aside, and count in the cache."""

    device: torch.device
    options: FuseOptions
    trace: Trace
    interrupts: InterruptGuard
    adoption: AdoptionPort
    hot: HotCallsPort
    hot_steps: HotStepsPort
    cache: GraphCache
    compiler: GraphCompiler
    publish: Any
    overhead_s: float
    capture_s: Counter[str]
    step_clock: StepClock

    def flush(self, reason: str, wait: bool = False, warming: bool = False) -> None: ...

    def mark_warming(self) -> None: ...
