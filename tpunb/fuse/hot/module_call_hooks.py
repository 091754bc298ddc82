"""tpunb's global ``nn.Module`` call hooks for a fused scope, in one place: what counts a
module's outermost calls (hotcalls.py on the native runtime, trained_modules.py where the
runtime fuses by itself) registers them here, and a call compiled whole lifts them while Dynamo
runs it (Dynamo would trace them and guard on their ids)."""

from __future__ import annotations

import _thread
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

ModuleCallback = Callable[[torch.nn.Module], None]
ModuleReturn = Callable[[torch.nn.Module, Any], None]  # the module, its call's outputs


class ModuleCallHooks:
    """A fused scope's global ``nn.Module`` call hooks, in one place so that a hot call can
    lift them all while Dynamo runs.

    Global hooks fire on every thread; only the calls of the thread that opened the scope (the
    notebook's) are the scope's. A module another thread calls meanwhile (a compile worker
    tracing a graph module, a data-loading thread of the user's) is not counted, and nothing of
    the notebook thread's (its dispatch modes, its hot-call depth) is touched from there.

    Nor are the calls the autograd engine makes during a backward (``in_backward``): gradient
    checkpointing's and reversible layers' recomputation call submodules from inside a
    backward node, and counted as outermost calls they turned hot and ran as compiled training
    calls of their own inside the backward (the tiny Reformer: four a step, 0.88x strict).
    Not counted, they run as they are, as they did in the forward, inside their model's call.
    A module already hot still runs its call compiled whole there, as its forward ran: a
    checkpointed model's recomputation must save what its forward saved (checkpointing checks)."""

    def __init__(self, before: ModuleCallback, after: ModuleReturn) -> None:
        self._before, self._after = before, after
        self._handles: list[Any] = []
        self._places: list[tuple[dict[int, Any], int]] = []
        self._installs = 0  # fused scopes may nest; the hooks go in once
        self._owner: int | None = None  # the thread of the outermost scope

    def _register(self) -> None:
        """Each handle is kept as soon as it exists, and what an interrupt left of an earlier
        install goes first: an interrupt that stopped a scope halfway through installing or
        removing left a hook of a finished scope in torch's tables, and every later hot call
        traced it (a graph break at its thread check) and ran uncompiled, refused for good."""
        self._remove()
        hooks = torch.nn.modules.module
        before = hooks.register_module_forward_pre_hook(self._before_call)
        self._handles.append(before)
        after = hooks.register_module_forward_hook(self._after_call, always_call=True)
        self._handles.append(after)
        # where they sit in torch's tables of global hooks, for lifting them out and back
        self._places = [
            (hooks._global_forward_pre_hooks, before.id),
            (hooks._global_forward_hooks, after.id),
            (hooks._global_forward_hooks_always_called, after.id),
        ]

    def _before_call(self, module: torch.nn.Module, args: Any) -> None:
        # (inside code Dynamo traces, a module compiled by the user: no graph break, no count)
        if torch.compiler.is_compiling():
            return
        if _thread.get_ident() == self._owner and not in_backward():
            self._before(module)

    def _after_call(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if _thread.get_ident() == self._owner and not in_backward():
            self._after(module, out)

    def _remove(self) -> None:
        self._places = []
        while self._handles:
            self._handles[-1].remove()  # (removing twice is harmless: an interrupt between)
            self._handles.pop()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        self._installs += 1
        try:
            if self._installs == 1:
                self._owner = _thread.get_ident()
                self._register()
            yield
        finally:
            self._installs -= 1
            if self._installs == 0:
                self._remove()

    @property
    def installed_now(self) -> bool:
        return self._installs > 0

    def lifted(self) -> _Lifted:
        """Without tpunb's hooks for the duration (none are lost: they come back after)."""
        return _Lifted(self)


class _Lifted:
    """``ModuleCallHooks.lifted``'s context: a class, not a generator (every hot call enters
    one). The hooks leave torch's tables of global hooks and go back under the same keys, at
    the end, where registering them again would put them: removing and registering them
    (new handles) cost 3.5 us of a small model's 35 us eager call (measured in situ)."""

    def __init__(self, hooks: ModuleCallHooks) -> None:
        self.hooks = hooks
        self.lifted: list[tuple[dict[int, Any], int, Any]] = []

    def __enter__(self) -> None:
        # (none where an outer hot call lifted them already)
        self.lifted = [(table, key, table.pop(key)) for table, key in self.hooks._places if key in table]

    def __exit__(self, *exc_info: object) -> None:
        for table, key, hook in self.lifted:
            table[key] = hook


def in_backward() -> bool:
    """Whether this thread is running a backward: the autograd engine is calling a node's
    Python code (a recomputation, a custom Function's backward, a hook)."""
    return torch._C._current_graph_task_id() != -1
