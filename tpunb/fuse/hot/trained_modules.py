"""Modules trained again and again in fused cells, compiled whole, forward and backward, where
the runtime fuses the notebook's ops by itself (TorchTPU's DEFER_AND_FUSE): tpunb records
nothing there, so its hot path (hotcalls.py, built on the recorder) cannot reach the chip.

Measured on a TPU v5e (torch_tpu 0.2.0; HF GPT-2, 6 layers, 384 wide, batch 8 x 256, AdamW, no
dropout), warm steps: strict 124 ms (bf16) and 131 ms (fp32); DEFER_AND_FUSE alone 70 and 66
ms; the model compiled whole by TorchTPU's ``"tpu"`` compiler through compile_later.py (the
capturing call run as captured, the compile on tpunb's worker thread, swapped in when ready) 30 and
28 ms: 4.2x and 4.7x strict, its losses DEFER_AND_FUSE's within 3e-4 over 12 steps. TorchTPU's
compiler ran off the notebook thread without error.

A module turns hot once it has been called outermost with grad in train mode and then stepped
by an optimizer that holds its parameters ``HOT_STEPS_AFTER`` times (config.py's count for hot
optimizer steps), and its steps have taken ``pays_off_after_s`` (rent or buy: what capturing
and compiling it costs the notebook; the runtime says how much; a step's time runs from the end
of the step before it in the same scope, so the wait where the loop reads a value counts), in
one cell or across cells. A short cell therefore
runs as it did without this, and a long training loop pays at most about twice. With
``--sync-compile`` it turns hot at its ``HOT_STEPS_AFTER``-th step and its call waits for the
compile. From then on its calls in that regime, in fused cells, go through Dynamo with
compile_later.py's backend (except while its first capture compiles: ``_routed``); in any other
regime or cell they are the module's own call. The
loop around it (the batch, the loss outside the module, ``backward()``, the optimizer's step)
runs as the cell's eager mode runs it. A module the user compiled already
(``model.compile()``) is left alone.

The module call hooks that count calls stay installed from the first fused cell on (and do
nothing outside fused cells: two Python calls per module call): hooks registered anew in each
cell would be new objects to Dynamo's guards, and a model the user compiled would recompile in
every cell (measured on the CPU: one more graph per cell). Inside code Dynamo traces they return
at once (``ModuleCallHooks``), so they break no graph of the user's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.eval_frame import OptimizedModule

from tpunb.events import FusionGroup, GroupStatus, Record
from tpunb.fuse import config
from tpunb.fuse.groups.cache import GraphCache
from tpunb.fuse.groups.compilers import Compile
from tpunb.fuse.groups.worker import compiling_only_if_free
from tpunb.fuse.hot.compile_later import CompileLater, GraphRuns
from tpunb.fuse.hot.module_call_hooks import ModuleCallHooks
from tpunb.fuse.workarounds import config_values, once_logging_out_of_graphs
from tpunb.source import locate


def call_row(name: str, status: GroupStatus, started: float, plan: str | None = None) -> FusionGroup:
    """A compiled call's group row, as the native hot path writes one (hotcalls.py): a miss
    when Dynamo captured a graph during it, ``compiling`` while a compile of its graphs is
    pending, a hit otherwise; ``plan``: why it ran otherwise."""
    where = locate()
    return FusionGroup(
        key=f"{name}-training",
        ops=0,
        top_ops={},
        input_shapes=[],
        trigger=f"{name} call, compiled whole (a trained model)",
        source=str(where) if where else name,
        status=status,
        compile_ms=None,
        run_ms=(time.perf_counter() - started) * 1000,
        lifted=0,
        whole_call=True,
        at=where.label if where else None,
        plan=plan,
    )


#: A call Dynamo ran as it is, past its limit of compiled versions (its row's plan).
PAST_LIMIT_PLAN = "run as it is: past Dynamo's limit of compiled versions of this model"


@functools.cache
def isolated_versions() -> dict[str, Any]:
    """``torch.compile``'s option that gives a model's Dynamo versions a region of their own
    (``isolate_recompiles``, torch 2.13; older torches lack it, and share the limit)."""
    accepted = inspect.signature(torch.compile).parameters
    return {"isolate_recompiles": True} if "isolate_recompiles" in accepted else {}


def versions_of_dead_models_uncounted() -> contextlib.AbstractContextManager[None]:
    """Dynamo's cap on all versions of a code object over the process (``accumulated_recompile_limit``,
    256) lifted for an isolated model's call: it counts the versions of models long gone too
    (their entries are dropped with them), and HF's GPT-2 takes three versions of a shared
    frame per model and shape, so the 86th GPT-2 of a session would run uncompiled. Each
    model's own limit (``recompile_limit``, 8) still holds."""
    from torch._dynamo import config

    return config_values(config, accumulated_recompile_limit=1 << 30)


def global_hooks_warning(message: str, filename: str, lineno: int) -> bool:
    """torch's warning at ``torch.compile(module)`` while global module hooks exist (that they
    fire for the ``OptimizedModule`` too): these hooks ignore it, so the warning is noise."""
    return message.startswith("Using `torch.compile(module)` when there are global hooks")


def in_training(module: torch.nn.Module) -> bool:
    """Whether a call of ``module`` now is a training call: grad on, the module in train mode."""
    return torch.is_grad_enabled() and module.training


class TrainedModules:
    """Counts the optimizer steps over each module trained in fused scopes and compiles the
    module whole once it is hot (``compile``: the runtime's training compiler, on ``cache``'s
    worker; ``around_compiled``: the runtime's Dynamo settings for its compiled calls;
    ``eligible``: which modules the runtime's compiler may take whole; ``publish``: where each
    compiled call's group row goes, as the native hot path's rows)."""

    def __init__(
        self,
        cache: GraphCache,
        compile: Compile,
        around_compiled: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
        eligible: Callable[[torch.nn.Module], bool] = lambda module: True,
        pays_off_after_s: float = 0.0,
        publish: Callable[[Record], None] | None = None,
    ) -> None:
        self.cache, self.compile, self.around_compiled = cache, compile, around_compiled
        self.eligible, self.pays_off_after_s, self.publish = eligible, pays_off_after_s, publish
        self.hooks = ModuleCallHooks(self._before, self._after)
        self._hooks_kept = contextlib.ExitStack()  # installed at the first scope, for good
        self._depth = 0
        self._active = False
        self._sync = False  # the scope's --sync-compile
        #: outermost modules called in training since the last optimizer step, with the time of
        #: the first such call
        self._trained_since_step: weakref.WeakKeyDictionary[torch.nn.Module, float] = (
            weakref.WeakKeyDictionary()
        )
        self._steps: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        #: the seconds its steps took before it turned hot, each from the end of the step before
        #: it in the same scope (the read that waits for the chip falls between two steps), or
        #: from its first call
        self._spent: weakref.WeakKeyDictionary[torch.nn.Module, float] = weakref.WeakKeyDictionary()
        self._last_step_end: weakref.WeakKeyDictionary[torch.nn.Module, float] = weakref.WeakKeyDictionary()
        #: the hot ones, with their backends (what they made: ``compiling``, errors)
        self.hot: weakref.WeakKeyDictionary[torch.nn.Module, CompileLater] = weakref.WeakKeyDictionary()
        #: calls run compiled, run otherwise while compiling (the capturing call as captured, the
        #: later ones as the module's own call), run with a graph whose compile failed (as
        #: captured), and run by Dynamo as they are, past its limit of compiled versions, by
        #: module class (counters)
        self.compiled_calls: Counter[str] = Counter()
        self.calls_while_compiling: Counter[str] = Counter()
        self.partly_compiled_calls: Counter[str] = Counter()
        self.calls_past_version_limit: Counter[str] = Counter()
        #: how many graphs a module's first capture made: its own call runs until they compile
        self._first_graphs: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        #: seconds of the calls during which Dynamo captured a module (on the notebook's thread),
        #: by module class: what a cell without --sync-compile waited for unasked
        self.capture_s: Counter[str] = Counter()
        #: FLOPs the compiled calls ran, forward and backward (flops.py), for the cell's MFU;
        #: steps of trained modules not yet hot, and calls with a graph whose FLOPs could not be
        #: counted, which leave a cell's MFU out (it would be too low)
        self.model_flops = 0.0
        self.steps_not_compiled = 0
        self.calls_flops_unknown = 0
        #: those Dynamo failed to capture: never hot again
        self.refused: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    @contextlib.contextmanager
    def scope(self, sync_compile: bool = False) -> Iterator[None]:
        """A fused cell's scope, on the notebook thread: calls counted, hot modules compiled
        (with ``sync_compile``, from their ``HOT_STEPS_AFTER``-th step, the call waiting for the
        compile), once-a-process logging skipped where Dynamo captures them (a Hugging Face
        model's ``warning_once`` on its loss path: one graph, not two)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._after_step)
        if not self.hooks.installed_now:
            self._hooks_kept.enter_context(self.hooks.installed())
        self._active, self._depth, self._sync = True, 0, sync_compile
        try:
            with once_logging_out_of_graphs():
                yield
        finally:
            handle.remove()
            self._active = False
            self._trained_since_step.clear()
            self._last_step_end.clear()
            self.cache.emit_warnings()

    def close(self) -> None:
        """Remove the hooks (a runtime let go of; a test's end)."""
        self._hooks_kept.close()

    def _before(self, module: torch.nn.Module) -> None:
        if not self._active:
            return
        counted = not isinstance(module, OptimizedModule) and module not in self.hot
        if self._depth == 0 and counted and in_training(module):
            self._trained_since_step.setdefault(module, time.perf_counter())
        self._depth += 1

    def _after(self, module: torch.nn.Module, out: Any) -> None:
        if self._active:
            self._depth = max(0, self._depth - 1)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        now = time.perf_counter()
        for module, first_call in list(self._trained_since_step.items()):
            if (
                module in self.refused
                or module._compiled_call_impl is not None
                or not any(id(p) in stepped for p in module.parameters())
            ):
                continue
            self._steps[module] = self._steps.get(module, 0) + 1
            self.steps_not_compiled += 1
            began = self._last_step_end.get(module, first_call)
            self._spent[module] = self._spent.get(module, 0.0) + now - began
            self._last_step_end[module] = now
            paid = self._sync or self._spent[module] >= self.pays_off_after_s
            if self._steps[module] >= config.HOT_STEPS_AFTER and paid and self.eligible(module):
                self._make_hot(module)
        self._trained_since_step.clear()

    def _make_hot(self, module: torch.nn.Module) -> None:
        """From the module's next training call in a fused scope, its calls in that regime run
        compiled whole (``nn.Module.compile``'s place for a compiled call, behind a check)."""
        backend = CompileLater(
            self.cache, type(module).__name__, lambda: self._sync, GraphRuns(), self.compile, count_flops=True
        )
        self.hot[module] = backend
        # Dynamo keeps its versions (8 at most) per code object, and a model's frames are its
        # class's: every model of the class, compiled anywhere, counts against one limit, and a
        # frame past it runs uncompiled for good. A set-up cell run a ninth time, or one
        # compile-mode ``generate`` (a version per length), left GPT-2 uncompiled in every later
        # fused cell (measured on the chip). Isolated, this model's versions are its own.
        compiled = torch.compile(module._call_impl, backend=backend, dynamic=False, **isolated_versions())
        module._compiled_call_impl = self._routed(module, compiled, backend)
        # Dynamo keeps its backends until it is reset: the graphs of a model that is gone go
        # with it (a set-up cell run again would keep each model's otherwise)
        weakref.finalize(module, backend.release)

    def _refuse(self, module: torch.nn.Module, why: str) -> None:
        """Dynamo failed to capture ``module``'s call (``why``): its own call from now on, said once."""
        module._compiled_call_impl = None
        self.hot.pop(module, None)
        self.refused.add(module)
        warnings.warn(
            f"tpunb fused: {type(module).__name__} runs op by op from now on, not compiled whole: {why}",
            RuntimeWarning,
            stacklevel=4,
        )

    def _routed(
        self, module: torch.nn.Module, compiled: Callable[..., Any], backend: CompileLater
    ) -> Callable[..., Any]:
        """The module's call: compiled in a fused scope in training, its own call otherwise.

        Until the graphs of its first capture have compiled, the calls after the one that
        captured it are its own call too, not the captured graphs: under DEFER_AND_FUSE its own
        call reuses the programs its earlier steps compiled, while the captured graphs (HF's
        GPT-2: four, with Dynamo's guards between them) are new programs to the runtime.
        Measured on a v5e (GPT-2 6 x 768, bf16, a 300-step fused cell): run as captured, steps
        took ~155 ms against 137 before the capture. (A shape captured later runs as captured
        while it compiles: the shapes compiled before keep running compiled meanwhile.)"""
        name = type(module).__name__

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._active and in_training(module):
                started = time.perf_counter()
                first = self._first_graphs.get(module)
                if first is not None and backend.compiling_among_first(first):
                    out = module._call_impl(*args, **kwargs)
                    self.calls_while_compiling[name] += 1
                    if self.publish is not None:
                        self.publish(call_row(name, GroupStatus.COMPILING, started))
                    return out
                graphs, runs, flops = len(backend.made), backend.runs.count, backend.runs.flops
                try:
                    # a call captured as several graphs (HF's masks break GPT-2's) must not wait
                    # while the worker compiles the first: the worker starts after the call
                    with (
                        self.hooks.lifted(),
                        self.around_compiled(),
                        compiling_only_if_free(self._sync) as may_compile,
                        versions_of_dead_models_uncounted(),
                    ):
                        out = compiled(*args, **kwargs)
                except torch._dynamo.exc.TorchDynamoException as error:  # raised while capturing: nothing ran
                    first_line = (str(error).splitlines() or [""])[0][:200]
                    why = f"Dynamo could not capture its call ({type(error).__name__}: {first_line})"
                    self._refuse(module, why)
                else:
                    if may_compile and not backend.made:  # (its forward is skipped, or disabled)
                        self._refuse(module, "Dynamo captured nothing of its call")
                        return out
                    # none of its graphs ran: Dynamo ran the call as it is, because the worker
                    # was busy (``compiling_only_if_free``) or past its limit of versions
                    as_it_is = backend.runs.count == runs
                    past_limit = as_it_is and may_compile
                    captured = len(backend.made) > graphs
                    if captured:
                        self._first_graphs.setdefault(module, len(backend.made))
                        if not self._sync:  # (--sync-compile asked for the wait)
                            self.capture_s[name] += time.perf_counter() - started
                    compiling = backend.compiling  # (read once: the worker may finish meanwhile)
                    if captured:
                        status = GroupStatus.MISS
                    elif past_limit:
                        status = GroupStatus.OP_BY_OP
                    else:
                        status = GroupStatus.COMPILING if compiling else GroupStatus.HIT
                    if past_limit:
                        self.calls_past_version_limit[name] += 1
                    elif compiling or as_it_is:
                        self.calls_while_compiling[name] += 1
                    elif backend.all_compiled:
                        self.compiled_calls[name] += 1
                        self.calls_flops_unknown += backend.flops_unknown
                    else:  # a graph whose compile failed runs as captured
                        self.partly_compiled_calls[name] += 1
                    self.model_flops += backend.runs.flops - flops
                    if self.publish is not None:
                        self.publish(call_row(name, status, started, PAST_LIMIT_PLAN if past_limit else None))
                    return out
            return module._call_impl(*args, **kwargs)

        return call
