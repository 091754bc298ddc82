"""Adoption: parameters, buffers and optimizer state become deferred-capable in place.

A fused cell adopts the notebook's modules and optimizers before it runs; while it runs,
modules called and optimizers stepped for the first time (made inside library code: an HF
``Trainer``'s optimizer, a model built in the user's ``train()``) are adopted as they first
run, so their updates fuse into the step too.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tpunb.fuse.aside import outside_modes
from tpunb.fuse.recording.deferred import DeferredTensor

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine


def tensors_of(objects: tuple[Any, ...]) -> Iterator[torch.Tensor]:
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            yield from obj.parameters()
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                yield from group["params"]
            for state in obj.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))
        elif isinstance(obj, torch.Tensor):
            yield obj


def adoptable(tensor: torch.Tensor, engine: HotPathEngine) -> bool:
    """A plain leaf tensor on the engine's device (not adopted yet), and no conjugate or
    negative view (a wrapper cannot carry the bit)."""
    return (
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.device == engine.device
        and tensor.is_leaf
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def adopt_tensor(tensor: torch.Tensor, engine: HotPathEngine) -> int:
    """Swap ``tensor``'s contents for a materialized DeferredTensor (same Python object).

    Returns 1 when adopted, 0 when it stays as it is: already adopted, another device, not a
    leaf, or referenced from C++ (an autograd graph) or weakly, where a swap is refused.
    """
    if not adoptable(tensor, engine):
        return 0
    wrapper = DeferredTensor.wrap(tensor.detach(), engine)
    wrapper.adopted = True
    if isinstance(tensor, torch.nn.Parameter):
        wrapper._is_param = True
    if tensor.requires_grad:
        wrapper.requires_grad_(True)
    if tensor.grad is not None:
        wrapper.grad = DeferredTensor.wrap(tensor.grad, engine)
    return int(swap_in_place(tensor, wrapper))


def release_tensor(tensor: torch.Tensor) -> bool:
    """The inverse of ``adopt_tensor``: a materialized wrapper becomes a plain tensor again (a
    Parameter if it was one, its gradient plain too), in place. For code that must see plain
    tensors (Dynamo, in a hot call: hotcalls.py). Returns whether it was released."""
    if type(tensor) is not DeferredTensor or tensor.pending is not None or tensor.value is None:
        return False
    value = tensor.value
    if getattr(tensor, "_is_param", False):
        plain = torch.nn.Parameter(value, requires_grad=tensor.requires_grad)
    else:
        plain = value.detach().requires_grad_(tensor.requires_grad)
    grad = tensor.grad
    if grad is not None:
        plain.grad = grad.value if type(grad) is DeferredTensor else grad
    return swap_in_place(tensor, plain)


def swap_in_place(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    """``torch.utils.swap_tensors``, all or nothing: whether it swapped.

    torch swaps the Python side (class, attributes) before the C++ side, and the C++ side
    refuses a tensor that something holds weakly there: ``torch.profiler`` with
    ``record_shapes`` does, for every tensor an op it recorded touched, as long as its
    results live. A refused swap would leave ``tensor`` a Parameter in name over a
    DeferredTensor's storage, failing every op after; so the Python side is swapped back.
    """
    kind = type(tensor)
    try:
        torch.utils.swap_tensors(tensor, other)
    except RuntimeError:
        if type(tensor) is not kind:  # refused halfway: undo the class and attribute swap
            for name in ("__class__", "__dict__"):
                mine, theirs = getattr(tensor, name), getattr(other, name)
                setattr(tensor, name, theirs)
                setattr(other, name, mine)
        return False
    return True


def plain_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's state tensors are plain (not tpunb's)."""
    return not any(
        type(value) is DeferredTensor for state in optimizer.state.values() for value in state.values()
    )


class Adoption:
    """What one engine adopted, and adopting more while its fused scopes run."""

    def __init__(self, engine: HotPathEngine) -> None:
        self.engine = engine
        self.modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        # param groups switched to foreach in this scope, with their own foreach and fused settings
        self._switched: list[tuple[dict[str, Any], bool | None, bool | None]] = []
        self._active = False
        self._step_hook: Any = None  # the optimizer step pre-hook, while a scope is active
        #: calls of ``adopt`` so far: a hot call whose module's tensors were plain at the last one
        #: need not look again (only adopting makes a plain tensor tpunb's)
        self.adoptions = 0
        #: optimizers whose parameters and state were plain, with ``adoptions`` then: their
        #: next steps need not walk them again until something is adopted (a step recorded
        #: meanwhile could still make new state tpunb's: its ops then go through the engine)
        self._plain_at: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()

    def adopt(self, objects: tuple[Any, ...]) -> int:
        """Adopt ``objects`` (modules, optimizers, tensors); returns how many tensors were swapped."""
        if not objects:
            return 0
        self.adoptions += 1
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self.modules.update(obj.modules())
            elif isinstance(obj, torch.optim.Optimizer):
                self.optimizers.add(obj)
                if self._active:
                    self._use_foreach(obj)
        return sum(adopt_tensor(tensor, self.engine) for tensor in tensors_of(objects))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """For a fused scope: adopted optimizers use their foreach form; an optimizer stepped
        for the first time is adopted just before it runs (a module called for the first
        time: ``on_module_call``, from the engine's module hooks)."""
        self._active = True
        for optimizer in list(self.optimizers):
            self._use_foreach(optimizer)
        outer, self._step_hook = self._step_hook, register_optimizer_step_pre_hook(self._on_step)
        try:
            yield
        finally:
            self._active = False
            self._step_hook.remove()
            self._step_hook = outer
            for group, foreach, fused in self._switched:
                group["foreach"] = foreach
                if fused is not None:
                    group["fused"] = fused
            self._switched = []

    def step_hook_lifted(self) -> _StepHookLifted:
        """Without the optimizer step pre-hook for the duration (a hot optimizer step: Dynamo
        would trace it); it comes back after."""
        return _StepHookLifted(self)

    def on_module_call(self, module: torch.nn.Module) -> None:
        """Called for every module call in a fused scope (the engine's global module hook)."""
        if module not in self.modules:
            self._adopt_new(module)

    def release(self, objects: tuple[Any, ...]) -> int:
        """Make ``objects``' adopted tensors plain again, in place (``release_tensor``); the
        next fused scope or recorded call adopts them again. Returns how many were released.
        Outside the engine's mode: recorded, the releasing ops (a parameter's ``detach``, a view)
        would make pending values of what must be plain (and keep the mode from stepping aside,
        so an optimizer's new state was recorded, and stayed tpunb's, step after step)."""
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                for module in obj.modules():
                    self.modules.discard(module)
            elif isinstance(obj, torch.optim.Optimizer):
                self.optimizers.discard(obj)
        with outside_modes():
            return sum(release_tensor(tensor) for tensor in list(tensors_of(objects)))

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        started = time.perf_counter()
        self.engine.step_clock.stepped(started)
        try:
            self._before_step(optimizer)
        finally:
            self.engine.overhead_s += time.perf_counter() - started  # (engine.py: overhead_s)

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        engine = self.engine
        engine.hot.turn_hot()  # the step's backward is done: no graph holds their parameters
        plain = self._plain_at.get(optimizer) == self.adoptions
        if plain or all(
            type(p) is not DeferredTensor for group in optimizer.param_groups for p in group["params"]
        ):
            # its parameters are plain: their module's calls are compiled whole (hotcalls.py),
            # its gradients came from autograd as they are. The step runs as eager PyTorch,
            # on plain state, outside recording (an update recorded per parameter would cost
            # a flush per write into a plain parameter); stepped again, compiled (hotsteps.py).
            if not plain and self.release_stepping(optimizer):
                self._plain_at[optimizer] = self.adoptions
            engine.hot_steps.on_plain_step(optimizer)
            if not engine.trace.ops:
                engine.modes.step_aside(engine)
            return
        engine.modes.resume()  # its state is the engine's (aside.py)
        if optimizer not in self.optimizers:
            self._adopt_new(optimizer)

    def _adopt_new(self, obj: Any) -> None:
        """Adopting swaps tensors the current trace may read: flush it first (once per object,
        on its first call, so steady steps are not cut)."""
        engine = self.engine
        if engine.trace.ops and any(adoptable(t, engine) for t in tensors_of((obj,))):
            engine.flush(f"adopting a new {type(obj).__name__}")
        with engine.interrupts, outside_modes():
            self.adopt((obj,))

    def release_stepping(self, optimizer: torch.optim.Optimizer) -> bool:
        """For a step over plain parameters (their module's calls are compiled whole): the
        optimizer's state becomes plain again, and its groups get their own settings back, so
        it steps as strict mode does, eagerly or compiled (hotsteps.py). Its state is tpunb's
        where the cell adopted the optimizer, or where a step was recorded before its module
        turned hot: skorch makes its optimizer inside ``fit`` and runs the forward in the
        step's closure, so SGD's momentum buffers were recorded, and every step after went
        through tpunb's wrappers (measured: 1.5 ms a step against strict's 0.8). Returns
        whether its state is plain now (a value still pending is not released yet); the
        common case, a plain state not adopted, walks the state once."""
        if optimizer not in self.optimizers and plain_state(optimizer):
            return True
        self.release((optimizer,))
        self._own_settings(optimizer)
        return plain_state(optimizer)

    def _own_settings(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer``'s groups back to their own foreach and fused settings (``_use_foreach``
        is for recorded steps). Compiled, the foreach form would also specialise the learning
        rate (a float argument of a foreach op), recompiling at every new value."""
        kept = []
        for group, foreach, fused in self._switched:
            if any(group is own for own in optimizer.param_groups):
                group["foreach"] = foreach
                if fused is not None:
                    group["fused"] = fused
            else:
                kept.append((group, foreach, fused))
        self._switched = kept

    def _use_foreach(self, optimizer: torch.optim.Optimizer) -> None:
        """In fused scopes an optimizer left to choose (``foreach=None``) or set to its fused
        kernel (``fused=True``, the HF Trainer's CPU default) runs its foreach form.

        On the CPU PyTorch picks the per-parameter for-loop, about a dozen small ops per
        parameter and step; recorded, each costs the engine's per-op bookkeeping, while the
        foreach form issues a handful of ops per step for all parameters, which the engine
        fuses itself. The fused kernel (``_fused_adamw_``) takes the learning rate as a
        Python float that Inductor cannot make a graph input (its ``tensor_lr`` form has no
        meta kernel), so an LR schedule would recompile every step. The numbers agree to
        float32 rounding (the model suite and tests/unit/test_fuse_models.py check them
        against strict mode). An explicit ``foreach=False`` or ``differentiable=True`` is kept.
        """
        for group in optimizer.param_groups:
            if "foreach" not in group or group["foreach"] is False or group.get("differentiable"):
                continue
            if group["foreach"] is None or group.get("fused"):
                self._switched.append((group, group["foreach"], group.get("fused")))
                group["foreach"] = True
                if group.get("fused"):
                    group["fused"] = False


class _StepHookLifted:
    """``Adoption.step_hook_lifted``'s context: a class, not a generator (every hot step enters
    one)."""

    def __init__(self, adoption: Adoption) -> None:
        self.adoption = adoption
        self.lifted = False

    def __enter__(self) -> None:
        adoption = self.adoption
        if adoption._step_hook is not None:
            adoption._step_hook.remove()
            self.lifted = True

    def __exit__(self, *exc_info: object) -> None:
        if self.lifted:
            self.adoption._step_hook = register_optimizer_step_pre_hook(self.adoption._on_step)
