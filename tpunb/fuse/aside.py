"""The engine's dispatch mode on the mode stack, and stepping it aside between hot calls.

A fused scope puts the engine's ``TorchDispatchMode`` on torch's mode stack, so every op
reaches the engine. That costs a Python call per op (about 2.5 us here) even for ops the
engine only runs at once: the argmax, ``cat`` and stopping checks of a decode loop around
a model that hotcalls.py compiles whole. Measured on the generation benchmark's 4-layer
Llama with a static cache: 63 such ops a step, a fifth of a fused ``generate()`` call.

So after an outermost hot call returns, with nothing recorded (the call flushed first,
and ran outside recording), the mode *steps aside*: it leaves the stack, and the loop's
ops on plain tensors (the call's outputs, the ids, the cache) run as eager PyTorch runs
them, which is what the engine would have done with them. Nothing is lost: the mode comes
back (*resumes*)

* when a module is called that is not compiled whole (the engine's module pre-hook), so
  its ops are recorded again;
* when an op reaches a tpunb wrapper (``DeferredTensor.__torch_dispatch__``: an adopted
  parameter, a pending value), which then goes to the engine as it would have;
* when an optimizer steps (its state is the engine's), and when the scope ends or a nested
  fused scope starts.

It resumes only onto the stack it left: a module called inside a mode the user entered
meanwhile does not put the engine's mode above theirs. An op of theirs that reaches a tpunb
wrapper does bring it back, from inside their mode's handler (where torch has taken their
mode off the stack for the call), so it lands beneath theirs: where it would have been.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._ops import _len_torch_dispatch_stack_pre_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode

#: What ``outside_modes`` enters when no mode is on either stack.
_NOTHING_TO_DISABLE = contextlib.nullcontext()


def outside_modes() -> contextlib.AbstractContextManager[object]:
    """torch's ``_disable_current_modes`` (every dispatch mode off the stacks for the block,
    back after), or nothing where no mode is on them: once the engine's mode has stepped
    aside, the stacks are empty around a hot call's eager run, and torch's context costs
    about 7 us each time (its imports and list building), several times a step."""
    if torch._C._len_torch_dispatch_stack() or _len_torch_dispatch_stack_pre_dispatch():
        return _disable_current_modes()
    return _NOTHING_TO_DISABLE


class ModeStack:
    """One engine's dispatch modes on torch's stack: entered per fused scope, stepped aside
    and resumed between hot calls."""

    def __init__(self) -> None:
        self._aside: TorchDispatchMode | None = None
        self._aside_depth = 0  # the stack's depth once the mode had left it

    @contextlib.contextmanager
    def entered(self, mode: TorchDispatchMode) -> Iterator[None]:
        """``mode`` on the stack for a fused scope; it leaves the stack at the end, whether it
        is on it or aside then."""
        self.resume()  # a nested scope starts from the outer one's mode on the stack
        mode.__enter__()
        try:
            yield
        finally:
            if self._aside is mode:
                self._aside = None  # already off the stack, its flags restored
            else:  # (only the top mode steps aside: while this one is on the stack, no outer one is)
                mode.__exit__(None, None, None)

    def step_aside(self, owner: object) -> None:
        """Take ``owner``'s mode off the stack, if it is on top (nothing else is stepped aside)."""
        if self._aside is not None:  # (a loop's every step asks, mostly when already aside)
            return
        mode = _get_current_dispatch_mode()
        if getattr(mode, "engine", None) is owner:
            mode.__exit__(None, None, None)
            self._aside, self._aside_depth = mode, torch._C._len_torch_dispatch_stack()

    def resume(self) -> bool:
        """Put a stepped-aside mode back, if the stack is as it left it. Whether it did."""
        if self._aside is None or torch._C._len_torch_dispatch_stack() != self._aside_depth:
            return False
        mode, self._aside = self._aside, None
        mode.__enter__()
        return True

    @property
    def stepped_aside(self) -> bool:
        """Whether ops issued now belong to a scope whose mode stepped aside."""
        return self._aside is not None and torch._C._len_torch_dispatch_stack() == self._aside_depth
