"""Hot optimizer steps: an optimizer stepped again and again over a hot module's parameters
runs its ``step()`` compiled whole, as PyTorch's compiled-optimizer recipe does
(``torch.compile(optimizer.step)``).

Once a module's training calls are compiled whole (hotcalls.py) its parameters are plain
tensors, and an optimizer over them steps as eager PyTorch (adopt.py): a dozen small ops per
parameter for Adam, each a Python call, more than the compiled forward and backward cost on
the small models notebooks train. Compiled, the whole update is a few fused kernels.

An optimizer is *hot* from its ``HOT_STEPS_AFTER``-th eager step over plain parameters in
fused scopes (the rule is plan.py's ``plan_step``): its ``step`` attribute (where
``torch.optim.lr_scheduler`` already puts its own wrapper) becomes a ``HotStep`` around the
step it had. In a fused scope, called without a closure, a hot step runs that step through
Dynamo, with the engine's hooks lifted (Dynamo would trace them), and everything inside it
traced as it is: the scheduler's wrapper, the step's pre- and post-hooks, ``_init_group``.
Elsewhere, with a closure (Lightning's, LBFGS's), or with pending values, it is the step it
wrapped.

The hyperparameters a schedule or the user changes every step (``lr``, ``betas``,
``weight_decay`` as Python floats in the param groups) become graph inputs: Dynamo specialises
a float the first time and makes it an input once it has changed, so a schedule costs one
recompile per hyperparameter that changes, never one per step (measured: 3 graphs for 12
steps of StepLR with hand-set betas; with ``dynamic=False`` Dynamo recompiled every step).
The groups stay as the user wrote them (floats, not tensors).

Like a hot call, a hot step runs eagerly (the step it wrapped, timed) until its eager steps
have cost what a compile costs the notebook (plan.py's ``compile_pays_off``), then compiled,
and eagerly for good if its first compiled runs prove slower (payoff.py). Like a hot training
call, the captured graph runs at once and the compile worker compiles it (compile_later.py);
its record is a group row keyed ``AdamW-step`` (``whole_call``).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from tpunb.events import OPTIMIZER_STEP_SUFFIX
from tpunb.fuse.aside import outside_modes
from tpunb.fuse.groups.plan import StepAction, StepFacts, plan_step
from tpunb.fuse.groups.worker import compiling_only_if_free
from tpunb.fuse.hot.compile_later import CompileLater, GraphRuns
from tpunb.fuse.hot.hotcode import calling
from tpunb.fuse.hot.payoff import Payoff
from tpunb.fuse.hot.whole_runs import count_eager_run, in_fused_scope, publish_compiled_run
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.workarounds import config_values

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine


class HotSteps:
    """Counts each optimizer's eager steps over plain parameters and makes the hot ones
    ``HotStep``s."""

    def __init__(self, engine: HotPathEngine) -> None:
        self.engine = engine
        self._steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._refused: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def on_plain_step(self, optimizer: torch.optim.Optimizer) -> None:
        """An eager step of ``optimizer`` over plain parameters in a fused scope is starting
        (adopt.py's step pre-hook): counted, and its next step made hot when ``plan_step``
        says so. A hot step running eagerly (its compile not paid off yet) is not planned again:
        its facts cost 3 us of a small model's step (measured)."""
        if isinstance(optimizer.__dict__.get("step"), HotStep):
            return
        options, steps = self.engine.options, self._steps.get(optimizer, 0) + 1
        action = plan_step(
            StepFacts(
                compile=options.compile,
                hot_training=options.hot_training,
                steps=steps,
                refused=optimizer in self._refused,
                traceable=all(
                    not g.get("differentiable") and not g.get("fused") for g in optimizer.param_groups
                ),
            )
        )
        if action is StepAction.AS_IS:
            return
        self._steps[optimizer] = steps
        if action is StepAction.HOT_FROM_NEXT_STEP:
            optimizer.step = HotStep(self.engine, optimizer)  # type: ignore[method-assign]

    def refuse(self, optimizer: torch.optim.Optimizer, step: HotStep) -> None:
        """Never compile ``optimizer``'s step again: Dynamo failed on it, or ran it uncompiled
        (past the limit of compiled versions of its step: ``versions_counted_per_optimizer``)."""
        if optimizer.__dict__.get("step") is step:
            optimizer.step = step.previous  # type: ignore[method-assign]
        self._refused.add(optimizer)


class HotStep:
    """An optimizer's ``step`` once hot: compiled whole in fused scopes, the step it wrapped
    elsewhere. An LR scheduler made after it wraps the optimizer's own step (``__func__``),
    and this one is installed again at a later step."""

    def __init__(self, engine: HotPathEngine, optimizer: torch.optim.Optimizer) -> None:
        self.engine = engine
        self.optimizer_ref = weakref.ref(optimizer)
        self.previous = optimizer.step
        self.name = type(optimizer).__name__
        self.key = self.name + OPTIMIZER_STEP_SUFFIX  # its group rows'
        self.trigger = f"{self.name}.step(), compiled whole (a hot optimizer step)"
        self.what = f"{self.name}.step()"  # its rows' words for it
        self.runs = GraphRuns()
        self.later = CompileLater(
            engine.cache,
            self.key,
            lambda: engine.options.sync_compile,
            self.runs,
            engine.compiler.compile_training,
        )
        # The compiled function must not hold the optimizer (Dynamo keeps it for the process):
        # a bound step is compiled as its function, the optimizer passed in; a scheduler's
        # wrapper holds it weakly. Once the optimizer is gone, so are its step's graphs,
        # which hold its parameters and state.
        self._pass_optimizer = getattr(self.previous, "__self__", None) is optimizer
        self._compiled: Callable[..., Any] | None = None  # made at the first compiled step
        self.payoff = Payoff()  # its eager and compiled steps' times
        weakref.finalize(optimizer, self.later.release)

    @property
    def compiled(self) -> Callable[..., Any]:
        """The step through Dynamo, made when first needed (a step whose compile never pays
        off never imports Dynamo's machinery)."""
        if self._compiled is None:
            step = self.previous.__func__ if self._pass_optimizer else self.previous
            # dynamic=None: a float that changes (a scheduled lr) becomes an input after one recompile
            self._compiled = torch.compile(calling(step), backend=self.later)
        return self._compiled

    @property
    def __func__(self) -> Any:
        """What ``torch.optim.lr_scheduler`` wraps when it is made after this: the class's step."""
        optimizer = self.optimizer_ref()
        return type(optimizer).step

    def __getattr__(self, name: str) -> Any:
        """``_wrapped_by_lr_sched``, where a scheduler's wrapper is inside: a new scheduler
        then does not wrap again, and schedulers find their wrapper still there."""
        if name == "_wrapped_by_lr_sched":
            return getattr(self.previous, name)
        raise AttributeError(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entered = time.perf_counter()
        optimizer = self.optimizer_ref()
        engine, options = self.engine, self.engine.options
        closure = args[0] if args else kwargs.get("closure")
        if (
            optimizer is None
            or closure is not None
            or len(args) + len(kwargs) > 1
            or (kwargs and "closure" not in kwargs)
            or not in_fused_scope(engine)
            or not (options.compile and options.hot_training)
            or engine.trace.ops
        ):
            return self.previous(*args, **kwargs)
        if not self.payoff.compiles_now(
            self._compiled is not None, options.sync_compile, options.compile_after_s
        ):
            # as strict mode steps: its pre-hook makes the state plain and steps aside (adopt.py)
            # (its pre-hook's time is counted by the hook: adopt.py)
            started = time.perf_counter()
            out = self.previous(*args, **kwargs)
            count_eager_run(engine, self.payoff, self.key, self.what, entered, started)
            return out
        if not self._made_plain(optimizer):
            return self.previous(*args, **kwargs)
        return self._run_compiled(optimizer)

    def _made_plain(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the step can run compiled: its parameters plain (their module is hot), and
        its state plain or made so (a fused cell adopts the notebook's optimizers as it starts)."""
        if not plain_parameters(optimizer):
            return False
        return self.engine.adoption.release_stepping(optimizer)

    def _run_compiled(self, optimizer: torch.optim.Optimizer) -> Any:
        from torch._dynamo.exc import InternalTorchDynamoError, TorchRuntimeError
        from torch._dynamo.utils import counters

        engine = self.engine
        started = time.perf_counter()
        engine.hot.turn_hot()  # what the step pre-hook does first; it is lifted for the call
        graphs, runs = counters["stats"]["unique_graphs"], self.runs.count
        with (
            engine.hot.hooks.lifted(),
            engine.adoption.step_hook_lifted(),
            outside_modes(),
            profiler_notice_hidden(),
            compiling_only_if_free(engine.options.sync_compile) as may_compile,
            versions_counted_per_optimizer(len(self.later.made)),
        ):
            try:
                out = self.compiled(optimizer) if self._pass_optimizer else self.compiled()
            except TorchRuntimeError:
                return self.previous()  # the user's own error, raised where it belongs
            except InternalTorchDynamoError as error:
                engine.hot_steps.refuse(optimizer, self)
                warnings.warn(
                    f"tpunb fused: Dynamo failed on {self.name}.step() ({error}); it steps as eager "
                    "PyTorch from now on",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return self.previous()
        step_s = time.perf_counter() - started
        compiled = counters["stats"]["unique_graphs"] - graphs
        uncompiled = self.runs.count == runs
        if uncompiled and may_compile:  # Dynamo's limit of versions of the step's code is spent
            engine.hot_steps.refuse(optimizer, self)
        publish_compiled_run(
            engine,
            self.payoff,
            self.what,
            step_s,
            key=self.key,
            trigger=self.trigger,
            started=started,
            compiled=compiled,
            uncompiled=uncompiled,
            compiling=self.later.compiling,
            may_compile=may_compile,
            compiled_call=self.compiled,
        )
        if not engine.trace.ops:
            engine.modes.step_aside(engine)
        return out


def versions_counted_per_optimizer(made: int) -> contextlib.AbstractContextManager[Any]:
    """Dynamo's limit of compiled versions (``recompile_limit``, 8), counted for one optimizer.

    Dynamo counts versions per code object, and a step runs in frames every optimizer of its
    class shares: PyTorch's ``_use_grad`` breaks the graph on purpose, so the class's own
    ``step`` is a frame of its own. Each new optimizer's step added a version there, and a
    notebook whose set-up cell made its optimizer a ninth time (run again) stepped eagerly from
    then on (measured). So while a hot step runs, Dynamo's own limit is the one it keeps over
    all versions of a frame (``accumulated_recompile_limit``, 256), and once this optimizer has
    made ``recompile_limit`` graphs (``made``), a step that fits none of them runs as it is."""
    from torch._dynamo import config

    limit = config.recompile_limit
    raised = config_values(config, recompile_limit=max(limit, config.accumulated_recompile_limit))
    return raised if made < limit else _eager_on_recompile(raised)


@contextlib.contextmanager
def _eager_on_recompile(context: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    with context, torch.compiler.set_stance("eager_on_recompile"):
        yield


def plain_parameters(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's parameters and gradients are plain tensors (not tpunb's)."""
    return all(
        type(param) is not DeferredTensor and type(param.grad) is not DeferredTensor
        for group in optimizer.param_groups
        for param in group["params"]
    )


class _DropProfilerNotice(logging.Filter):
    """Drops Dynamo's notice that it ignores ``record_function`` while a hot step runs: entered
    per step, it counts steps in progress (a filter added and removed per step cost 10 us)."""

    def __init__(self) -> None:
        super().__init__()
        self.stepping = 0
        self.added = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.stepping and "Profiler record function" in record.getMessage())

    def __enter__(self) -> None:
        if not self.added:
            logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(self)
            self.added = True
        self.stepping += 1

    def __exit__(self, *exc_info: object) -> None:
        self.stepping -= 1


_PROFILER_NOTICE = _DropProfilerNotice()


def profiler_notice_hidden() -> contextlib.AbstractContextManager[None]:
    """Dynamo logs, once, that it ignores ``Optimizer.step``'s ``record_function`` (torch's own
    wrapper, not the user's code): noise in the user's cell. Elsewhere (a compile-mode cell's
    own ``torch.compile``) the notice is left as it is."""
    return _PROFILER_NOTICE
