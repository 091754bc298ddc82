"""``Module.to(device)`` keeps each parameter the object it was, on TorchTPU and PyTorch/XLA.

PyTorch moves a module's parameters in place (``param.data = moved``) where the two tensor
types allow it (CPU to CUDA), and otherwise makes a new ``Parameter`` at every place a
parameter sits. TorchTPU's and PyTorch/XLA's tensors are of the second kind, so
``model.to(DEVICE)`` unties tied weights: GPT-2's output layer and its token embedding become
two parameters, trained apart. Measured on a v5e: strict's GPT-2 losses on the chip were the
CPU's for an untied model (5.4389 at step 2 against the untied CPU's 5.4401, the tied CPU's
5.4714), and notebook 03 counted 162.8 M parameters where the CPU counts 134.5 M (SmolLM2's
embedding twice). An optimizer made before the move is left holding the CPU tensors too.

So with either runtime tpunb turns on PyTorch's own remedy for the process,
``torch.__future__.set_swap_module_params_on_conversion(True)``: each moved tensor is swapped
into the parameter object, which keeps ties and the optimizer's references, as a move to CUDA
does. PyTorch refuses that swap for a parameter something holds a weak reference to, and
Dynamo's guards hold every parameter a compiled function touched that way: HF's
``Trainer.train()`` in a compile cell failed on a v5e with ``_apply(): Couldn't swap
Embedding.weight`` (accelerate moves the model again inside the traced loop). For such a
module the move runs as PyTorch's default does and tpunb then ties again what was tied, as
accelerate does on TPUs; references held elsewhere (an optimizer's) stay as PyTorch leaves
them. ``torch.__future__.set_swap_module_params_on_conversion(False)`` brings back PyTorch's
default everywhere.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from collections.abc import Callable
from typing import Any

_MARK = "_tpunb_keeps_ties"
#: Set while a move decides for a whole module tree: PyTorch moves children through the same
#: method, and the decision (swap or fall back) is the outermost call's.
_deciding = contextvars.ContextVar("tpunb_moving_module", default=False)


def keep_parameters_when_moved(torch: Any) -> None:
    """For the rest of the process (the runtime lives as long); called on the notebook thread."""
    torch.__future__.set_swap_module_params_on_conversion(True)
    module_class = torch.nn.Module
    if not getattr(module_class._apply, _MARK, False):
        module_class._apply = _falling_back_where_held_weakly(torch, module_class._apply)


def _falling_back_where_held_weakly(torch: Any, apply: Callable[..., Any]) -> Callable[..., Any]:
    """``Module._apply`` (the one path ``to``, ``cuda``, ``float``... take), swapping where
    PyTorch can and moving as PyTorch's default then re-tying where it cannot."""
    future = torch.__future__

    @functools.wraps(apply)
    def apply_keeping_ties(module: Any, fn: Callable[..., Any], recurse: bool = True) -> Any:
        if _deciding.get() or not future.get_swap_module_params_on_conversion():
            return apply(module, fn, recurse)
        token = _deciding.set(True)
        try:
            if not _held_weakly(module, recurse):
                return apply(module, fn, recurse)
            ties = _tied_places(module, recurse)
            future.set_swap_module_params_on_conversion(False)
            try:
                result = apply(module, fn, recurse)
            finally:
                future.set_swap_module_params_on_conversion(True)
            _tie_again(ties)
            return result
        finally:
            _deciding.reset(token)

    setattr(apply_keeping_ties, _MARK, True)
    return torch.compiler.disable(apply_keeping_ties)  # a move is never graph work


def _held_weakly(module: Any, recurse: bool) -> bool:
    """Whether PyTorch would refuse to swap one of the parameters (or gradients) moved."""
    for parameter in module.parameters(recurse=recurse):
        if weakref.getweakrefcount(parameter) or (
            parameter.grad is not None and weakref.getweakrefcount(parameter.grad)
        ):
            return True
    return False


def _tied_places(module: Any, recurse: bool) -> list[list[tuple[Any, str]]]:
    """The (owning module, attribute) places of each parameter held at more than one place."""
    places: dict[int, list[tuple[Any, str]]] = {}
    for name, parameter in module.named_parameters(recurse=recurse, remove_duplicate=False):
        owner_name, _, attribute = name.rpartition(".")
        places.setdefault(id(parameter), []).append((module.get_submodule(owner_name), attribute))
    return [group for group in places.values() if len(group) > 1]


def _tie_again(ties: list[list[tuple[Any, str]]]) -> None:
    """Every place of a tied group holds its first place's moved parameter again."""
    for (first_owner, first_attribute), *others in ties:
        kept = first_owner._parameters[first_attribute]
        for owner, attribute in others:
            owner._parameters[attribute] = kept
