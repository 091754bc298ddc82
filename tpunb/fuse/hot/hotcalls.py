"""Hot module calls: a module called again and again in fused scopes (generation, an
evaluation loop, a training step's forward) is compiled whole, Python included, instead of
being recorded op by op.

Recording costs the engine's bookkeeping per op (about 15 us here) against 3-4 us for eager
PyTorch. In a training step that is repaid: forward, backward and the optimizer fuse into
one compiled group. A decode step is another matter: a few hundred tiny ops on a batch of a
few tokens, each recorded again at every step, only to run a graph that costs what eager
does. Measured on the generation benchmark's 4-layer Llama: fused 0.07x strict tokens/s
with every decode step a cache hit. No per-op scheme gets that back, so such a call skips
per-op dispatch altogether: Dynamo captures the module's Python with guards (so a changed
shape, flag or branch recompiles rather than replaying something else) and Inductor
compiles it, as ``torch.compile`` would.

A module is *hot* on its first (or ``HOT_AFTER``-th, below) outermost call in fused scopes
with grad mode off and the module in eval mode (inference), or with grad on in train mode
(training, below); the rule is plan.py's ``plan_call``. Every call with compiling off stays
recorded, and so do the mixes (grad on in eval mode). From then on the module's
``_compiled_call_impl`` (where ``nn.Module.compile`` puts its compiled call) sends such
calls through Dynamo, after flushing what is pending and handing it real tensors:

* pending arguments are materialized; the module's adopted parameters and buffers, and
  adopted tensors held by argument objects (an HF cache's key and value tensors), become
  plain tensors again, in place (``release_tensor``): Dynamo guards and traces plain
  tensors, not tpunb's wrappers;
* tpunb's global module hooks are lifted during the call (``ModuleCallHooks.lifted``): Dynamo
  would trace them and guard on their ids, which change with every fused scope.

Outside fused scopes, with grad on or in train mode, the call is the module's own. After an
outermost compiled call the engine's dispatch mode steps aside until something needs it again
(aside.py), so the loop around the model runs as eager PyTorch, without a Python call per op.

A hot call is not compiled at once: it runs *eagerly* (the module's own call on plain
tensors, outside recording, as strict mode runs it), timed, until its eager runs have cost
what a compile costs the notebook (plan.py's ``compile_pays_off``, ``COMPILE_COST_S``), and
only then goes through Dynamo. Dynamo's capture alone costs a small model's call hundreds of
its eager runs, so a short cell (a ten-step loop, one ``generate()``) runs at strict's speed
and compiles nothing, while a long loop compiles once its compile pays off. That is also why
a module is hot from its first call there (``plan_call``); with ``--sync-compile`` (or
``FuseOptions.compile_after_s=0``) hot calls compile from their first run, and a module is
hot from its ``HOT_AFTER``-th call. Once a regime has run compiled, its calls stay compiled.

The calls before it turns hot are recorded as usual, but the traces they touch are marked
*warming* and their groups are not compiled (plan.py): they will not come back, so their
compiles (one per distinct layer group of each of the first calls, seconds each) would only
keep the compile worker busy, and a ``generate()`` call would count them. A training module's
first step is warming to its end (its loss, backward and gradient clip too), until the
optimizer step that makes the module hot.

A hot call's compiled code is its architecture's (hotcode.py): a model built again (a set-up
cell run again) runs what its predecessor compiled, from its first hot call, with no capture.
It starts in a small frame of tpunb's with a code object per architecture (``calling``):
Dynamo skips ``torch.nn``'s own frames, so a model made of its modules would never compile
from ``_call_impl``. Past 8 recompiles of one architecture (8 input shapes), Dynamo runs its
calls as they are (with its warning), outside recording, as fast as strict mode.

**Training** (``FuseOptions.hot_training``, on unless ``%tpu_mode fused --no-hot-training``):
a module called with grad in train mode turns hot the same way, but at the next optimizer step
(``turn_hot``), when no autograd graph holds its adopted parameters any more, or, where no
optimizer of torch's steps (Keras, updates written by hand), at its first call after a
backward has run through all of its recorded calls (``Turning``); its calls then compile
through ``compile_later.py``: the captured graph runs at once while the compile worker
compiles forward and backward, and the compiled code is swapped in when ready. The loop around
it (a batch drawn, the loss, ``backward()``) runs as eager PyTorch, and an optimizer over its
now plain parameters steps eagerly, then compiled whole (hotsteps.py). Its backward runs as
its forward did, on plain tensors outside recording (hot_backward.py).

A hot inference call, once paid for, compiles in the call, as compile mode does (seconds;
Dynamo compiles on the calling thread); a training call's graphs compile on the worker
(compile_later.py). A graph the engine's compiler (compilers.py) fails to compile runs as
Dynamo captured it, op by op (``compiled_or_captured``), with a warning: slower, never wrong. (Dynamo's own
``suppress_errors`` would do the same for its errors, but patching it around every call
costs 250 us a call here.) An error of Dynamo itself turns the module's hot call off, with
a warning, and is raised. Random ops compile with ``fallback_random``, so they draw what
eager PyTorch draws (as the engine's groups do). Each hot call is published as a group
record keyed by the module's class, so the monitor's group list and the cache counters show
it: a miss when Dynamo compiled a graph during the call, a hit otherwise.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse import config
from tpunb.fuse.aside import outside_modes
from tpunb.fuse.groups.plan import CallAction, CallFacts, Regime, compile_pays_off, plan_call, runs_whole
from tpunb.fuse.groups.worker import compiling_only_if_free
from tpunb.fuse.hot.hot_backward import backward_as_forward, next_node_number
from tpunb.fuse.hot.hotcode import HotCode, HotCodes, architecture
from tpunb.fuse.hot.module_call_hooks import ModuleCallHooks
from tpunb.fuse.hot.payoff import Payoff
from tpunb.fuse.hot.whole_runs import count_eager_run, in_fused_scope, publish_compiled_run
from tpunb.fuse.recording.adopt import release_tensor, tensors_of
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.recording.settled import mark

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine

#: A module's call count once Dynamo has failed on it: never eligible again.
REFUSED = -1


class HotCalls:
    """Counts outermost module calls in fused scopes and makes the hot ones compiled calls."""

    def __init__(self, engine: HotPathEngine) -> None:
        self.engine = engine
        self.hooks = ModuleCallHooks(self._before, self._after)
        self.codes = HotCodes(engine)  # compiled calls, by architecture (hotcode.py)
        self._depth = 0
        #: calls under way that pass through (``holds_tensors``): a loss module called between hot calls
        self._passing = 0
        self._calls: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        self._turning: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: inside an outermost call of a module that is compiled whole from its next call or
        #: soon, or between a training call and the step that makes its module hot: what is
        #: recorded now will not be recorded again (plan.py: not compiled)
        self.warming = False
        #: the last outermost call was a training call counted toward hot (``CallAction.WARM``):
        #: the rest of its step is warming too
        self._step_warming = False

    def _before(self, module: torch.nn.Module) -> None:
        if self._depth == 0 and self.engine.modes.stepped_aside and not holds_tensors(module):
            self._passing += 1  # holds_tensors: it passes through
            return
        # (an interrupt waits for the hooks: one between counting and the depth's update would
        # leave the depth off for good, and no module would turn hot again: interrupts.py)
        with self.engine.interrupts:
            self.engine.modes.resume()  # its ops are recorded (aside.py)
            self.engine.adoption.on_module_call(module)
            if self._depth == 0:
                self._plan_call(module)
            self._depth += 1

    @property
    def in_call(self) -> bool:
        """Whether an outermost module call of a fused scope is under way."""
        return self._depth > 0

    def turn_hot(self, only: torch.nn.Module | None = None) -> None:
        """Make the modules that became hot for training (``only``, or all) hot calls, now
        that no autograd graph uses their adopted parameters: called before an optimizer
        steps (the step's backward is done), when a fused scope starts, and at a module's
        call once a backward has reached it since its last (``Turning``). Not at once: the
        first hot call releases the parameters (``swap_tensors``), which poisons a graph
        still holding them (a module called twice in a step, its first call recorded:
        "AccumulateGrad node that was poisoned by swap_tensors"). What is pending runs first:
        the parameters and their gradients (a recorded backward's) must have values to be
        released with."""
        if not self._turning:  # (every optimizer step asks: iterating a WeakSet costs more)
            self.warming = False
            return
        turning = [m for m in self._turning if only is None or m is only]
        for module in turning:
            self._turning.discard(module)
        # (what is pending was recorded warming: its trace says so; and a module that turned
        # and was freed since has left the set, so a scope starts warming only for those left)
        self.warming = bool(self._turning)
        if not turning:
            return
        if self.engine.trace.ops:
            self.engine.flush("a module turning hot")
        for module in turning:
            if module._compiled_call_impl is None or isinstance(module._compiled_call_impl, Turning):
                module._compiled_call_impl = HotCall(self.engine, module, self.codes)
                self.engine.adoption.release((module,))

    def _after(self, module: torch.nn.Module, out: Any) -> None:
        if self._depth == 0 and self._passing:  # (calls end in the order opposite to their start)
            self._passing -= 1
            return
        with self.engine.interrupts:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                # the rest of a training module's first step (its loss, backward, a gradient
                # clip) runs hot from the next step on: recorded once, it would compile in the
                # background only to contend with the eager steps after (measured: the HF
                # Trainer's warm steps at 3-6x their time while its clip group compiled); so
                # does the rest of each step whose training call was counted toward hot
                self.warming = bool(self._turning) or self._step_warming
                if isinstance(module._compiled_call_impl, Turning):
                    module._compiled_call_impl.watch(out)

    def refuse(self, module: torch.nn.Module) -> None:
        """Never compile ``module`` whole again (Dynamo failed on it): its calls are recorded."""
        module._compiled_call_impl = None
        self._calls[module] = REFUSED

    def _plan_call(self, module: torch.nn.Module) -> None:
        """An outermost call: counted toward compiling its module whole, and the module made
        hot when ``plan_call`` says so."""
        counted = self._calls.get(module, 0)
        options = self.engine.options
        now = regime(module)
        action = plan_call(
            CallFacts(
                regime=now,
                holds_tensors=holds_tensors(module),
                compile=options.compile,
                hot_training=options.hot_training,
                calls=counted + 1,
                refused=counted == REFUSED,
                # by us, or nn.Module.compile
                compiled_elsewhere=module._compiled_call_impl is not None
                and not isinstance(module._compiled_call_impl, Turning),
                compiles_at_once=compile_pays_off(0.0, options.sync_compile, options.compile_after_s),
            )
        )
        self._step_warming = action is CallAction.WARM and now is Regime.TRAINING
        if action is CallAction.RECORD:
            return
        self._calls[module] = counted + 1
        self.warming = True
        self.engine.mark_warming()
        if action is CallAction.HOT_FROM_NEXT_STEP:
            self._turning.add(module)  # at the next optimizer step (turn_hot), or call (Turning)
            if module._compiled_call_impl is None:
                module._compiled_call_impl = Turning(self.engine, module)
        elif action is CallAction.HOT_FROM_NEXT_CALL:
            module._compiled_call_impl = HotCall(self.engine, module, self.codes)


class Turning:
    """A training module's call between its first recorded call and the one that runs it
    whole: the module's own call (recorded), until every recorded call's outputs have had
    their backward, when no graph holds its parameters any more and it turns hot
    (``HotCalls.turn_hot``) at once, this call included.

    An optimizer's step turns it hot before that (the step's pre-hook), but not every loop
    steps one of torch's: Keras applies its own optimizer's updates, and a loop written from
    scratch updates ``p -= lr * p.grad`` by hand. Their modules stayed recorded to the cell's
    end (Keras's loop at 0.34x strict, measured). A call whose outputs never get a backward
    (one detached, a siamese pair's second call) keeps it waiting for an optimizer step."""

    def __init__(self, engine: HotPathEngine, module: torch.nn.Module) -> None:
        self.engine = engine
        self.module_ref = weakref.ref(module)
        self.watched = 0  # recorded calls whose outputs are watched
        self.unconsumed = 0  # of those, the calls no backward has run through yet

    def watch(self, out: Any) -> None:
        """After a recorded outermost call: count it until a backward runs through its outputs."""
        from torch.utils._pytree import tree_leaves

        nodes = [t.grad_fn for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not nodes:
            return
        self.watched += 1
        self.unconsumed += 1
        done = False

        def consumed(*_: Any) -> None:  # (on the thread that runs the backward)
            nonlocal done
            if not done:
                done = True
                self.unconsumed -= 1

        for node in nodes:
            node.register_hook(consumed)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module_ref()  # alive: it is the module being called
        hot = self.engine.hot
        if self.watched and not self.unconsumed and not hot.in_call and in_fused_scope(self.engine):
            hot.turn_hot(module)
            if isinstance(module._compiled_call_impl, HotCall):
                return module._compiled_call_impl(*args, **kwargs)
        return module._call_impl(*args, **kwargs)


def left_to_adopt(objects: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a fused scope adopts as it starts, of ``objects``: not a module whose training
    calls already run compiled whole, nor an optimizer over its parameters only, nor their
    tensors through another object (a LoRA model's frozen base, held in its own variable).

    Their tensors must be plain when they run (the hot call and the hot step release them),
    and Dynamo's guards hold them weakly, so a swap is refused after a wrapper was made: a
    scope per step paid about 27 us a tensor (measured: 5.7 ms of a 12 ms step of a tiny BERT
    with AdamW, 212 tensors). A call of such a module that is recorded after all (another
    regime, hot training off) adopts it then (``Adoption.on_module_call``), as it does any
    module called first."""
    hot = [
        obj
        for obj in objects
        if isinstance(obj, torch.nn.Module)
        and isinstance(obj._compiled_call_impl, HotCall)
        and Regime.TRAINING in obj._compiled_call_impl.called
    ]
    if not hot:
        return objects
    plain = {id(tensor) for tensor in tensors_of(tuple(hot))}
    left: list[Any] = []
    for obj in objects:
        if any(obj is module for module in hot):
            continue
        if isinstance(obj, torch.optim.Optimizer):
            if not all(id(p) in plain for group in obj.param_groups for p in group["params"]):
                left.append(obj)
        elif isinstance(obj, torch.nn.Module) and any(id(t) in plain for t in tensors_of((obj,))):
            left.extend(t for t in tensors_of((obj,)) if id(t) not in plain)  # its own, as tensors
        else:
            left.append(obj)
    return tuple(left)


def holds_tensors(module: torch.nn.Module) -> bool:
    """Whether ``module`` (or a submodule) has parameters or buffers.

    One that has none (a loss, an activation) *passes through*: called between hot calls, with
    the engine's mode stepped aside, it runs as it is, as the same code written as a function
    (``F.cross_entropy``) would, without bringing the mode back; in a fused scope's recording
    its ops are recorded, and it never turns hot itself (plan.py). A hot call of its own cost
    more than the loss it computes (measured: ignite's loop, whose loss is an
    ``nn.CrossEntropyLoss``, at 0.85x strict)."""
    if not (module._parameters or module._buffers or module._modules):
        return False  # (a loss or an activation, asked at each of its calls)
    return (
        any(tensor is not None for tensor in module._parameters.values())
        or any(tensor is not None for tensor in module._buffers.values())
        or any(holds_tensors(child) for child in module._modules.values() if child is not None)
    )


def regime(module: torch.nn.Module) -> Regime | None:
    """Which hot regime a call of ``module`` is in now: no grad in eval mode (inference), grad
    in train mode (training); None for the mixes (a frozen-statistics fine-tune, say), which
    stay recorded."""
    grad = torch.is_grad_enabled()
    if not grad and not module.training:
        return Regime.INFERENCE
    if grad and module.training:
        return Regime.TRAINING
    return None


class HotCall:
    """A hot module's call: compiled whole in fused scopes, in its regime (no grad in eval
    mode: Dynamo and Inductor at once; grad in train mode, unless hot training is off: Dynamo, then
    AOTAutograd and Inductor on the worker), the module's own call otherwise. Pickling a
    module drops it (``nn.Module.__getstate__``)."""

    def __init__(self, engine: HotPathEngine, module: torch.nn.Module, codes: HotCodes) -> None:
        self.engine = engine
        self.codes = codes  # its owner's compiled calls, by architecture
        self.module_ref = weakref.ref(module)
        self.name = type(module).__name__
        self.architecture = architecture(module)  # whose compiled code it runs (hotcode.py)
        self._codes: dict[Regime, HotCode] = {}
        #: what it shares with earlier definitions of its classes (a script run again)
        self.kin = codes.kin(module, self.architecture)
        # its eager and compiled runs' times, from what compiling saved its lineage's calls
        self.payoff = {now: Payoff(saving=codes.saving(self.kin, now)) for now in Regime}
        self.tensors = [*module.parameters(), *module.buffers()]
        self._plain_since = -1  # the count of adoptions when its tensors were last seen plain
        self.called: set[Regime] = set()  # the regimes it has run compiled in
        #: per regime, ``HotCodes.count`` when its architecture last had no code there
        self._none_at: dict[Regime, int] = {}
        self._flush_reason = f"{self.name} call (compiled whole)"  # (made once: every call flushes)
        self._what = f"{self.name} call"  # its rows' words for it (made once: every call counts)
        # its group rows' keys and triggers, by regime (made once: every call names them)
        self._keys = {Regime.TRAINING: f"{self.name}-training", Regime.INFERENCE: f"{self.name}-whole"}
        self._triggers = {
            now: f"{self.name} call, compiled whole (a hot {kind} call)"
            for now, kind in ((Regime.TRAINING, "training"), (Regime.INFERENCE, "no-grad"))
        }

    def code(self, now: Regime) -> HotCode:
        """Its architecture's compiled call in regime ``now`` (hotcode.py), looked up once (the
        architecture's key hashes a tuple per parameter)."""
        code = self._codes.get(now)
        if code is None:
            code = self._codes[now] = self.codes.made(self.architecture, now, self.name)
        return code

    def _compiled_before(self, now: Regime) -> bool:
        """Whether it, or a module of its architecture, has run compiled in regime ``now``."""
        if now in self.called:
            return True
        code = self._codes.get(now)
        if code is None:  # (asked every eager call: look it up only once a code was made)
            codes = self.codes
            if self._none_at.get(now) == codes.count:
                return False
            code = codes.get(self.architecture, now)
            if code is None:
                self._none_at[now] = codes.count
                return False
            self._codes[now] = code
        return code.ran_compiled and not code.slower

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entered = time.perf_counter()
        module = self.module_ref()  # alive: it is the module being called
        now = regime(module)
        options = self.engine.options
        if not runs_whole(now, in_fused_scope(self.engine), options.compile, options.hot_training):
            return module._call_impl(*args, **kwargs)
        if not self.payoff[now].compiles_now(
            self._compiled_before(now), options.sync_compile, options.compile_after_s
        ):
            return self._run_eager(module, args, kwargs, now, entered)
        return self._run_compiled(module, args, kwargs, now)

    def key(self, now: Regime) -> str:
        """Its group rows' key in regime ``now``."""
        return self._keys[now]

    def _run_eager(
        self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], now: Regime, entered: float
    ) -> Any:
        """The call as strict mode runs it, on plain tensors outside recording, timed toward
        its compile paying off; the loop around it runs as eager PyTorch too (aside.py). What
        the engine spent around it since ``entered`` is its overhead (``engine.overhead_s``)."""
        engine = self.engine
        args, kwargs = self._plain_arguments(module, args, kwargs)
        self._step_aside()
        started = time.perf_counter()
        with engine.hot.hooks.lifted(), outside_modes():
            out = module._call_impl(*args, **kwargs)
        weight = config.TRAINING_STEP_PER_FORWARD if now is Regime.TRAINING else 1.0
        payoff = self.payoff[now]
        if count_eager_run(engine, payoff, self.key(now), self._what, entered, started, weight):
            # judged by this run (``Payoff.awaiting_eager``), as a compiled run's verdict is
            if payoff.slower:
                self.code(now).slower = True
            self._note_saving(now, payoff)
        return mark(out)

    def _note_saving(self, now: Regime, payoff: Payoff) -> None:
        """What compiling saved its calls, measured so far, kept for a model defined again."""
        if (saving := payoff.measured_saving()) is not None:
            self.codes.measured(self.kin, now, saving)

    def _run_compiled(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], now: Regime) -> Any:
        from torch._dynamo.utils import counters

        engine = self.engine
        started = time.perf_counter()
        args, kwargs = self._plain_arguments(module, args, kwargs)
        self._step_aside()
        code = self.code(now)
        graphs, runs = counters["stats"]["unique_graphs"], code.runs.count
        first_node = next_node_number()
        call_started = time.perf_counter()
        with (
            engine.hot.hooks.lifted(),
            outside_modes(),
            compiling_only_if_free(engine.options.sync_compile) as may_compile,
        ):
            out = self._call_through_dynamo(module, code, args, kwargs)
        call_s = time.perf_counter() - call_started
        made = range(first_node, next_node_number())
        compiled = counters["stats"]["unique_graphs"] - graphs
        # Dynamo ran it as it is: past its recompile limit, or the worker held the compiler
        uncompiled = code.runs.count == runs
        if may_compile:
            if uncompiled and not compiled and not self._compiled_before(now):
                self._refused_at_first_call(module)
            self.called.add(now)
            code.ran_compiled = code.ran_compiled or not uncompiled
        training = now is Regime.TRAINING
        payoff = self.payoff[now]
        timed = len(payoff.compiled_s)
        if publish_compiled_run(
            engine,
            payoff,
            self._what,
            call_s,
            key=self.key(now),
            trigger=self._triggers[now],
            started=started,
            compiled=compiled,
            uncompiled=uncompiled,
            compiling=code.compiling,
            may_compile=may_compile,
            compiled_call=code.compiled,
            compile_in_call=not training,
        ):
            code.slower = True  # a model built again runs eagerly first too (and times it again)
        if len(payoff.compiled_s) != timed:
            self._note_saving(now, payoff)
        if training:
            backward_as_forward(engine, out, made)
        return mark(out)  # and if it is recorded again, it works on these: settled.py

    def _step_aside(self) -> None:
        """From an outermost hot call on, the loop around it runs as eager PyTorch (aside.py):
        the engine's mode steps aside before the call (what was recorded has run), so that the
        call finds no mode to take off the stacks (``outside_modes``: 7 us each time, the first
        call of every scope)."""
        engine = self.engine
        if not engine.hot.in_call and not engine.trace.ops:
            engine.modes.step_aside(engine)

    def _plain_arguments(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """The call's arguments and the module's tensors as plain tensors, for Dynamo.

        What was recorded before the call (a batch picked, moved) runs first, uncompiled: from
        now on the loop around hot calls runs as eager PyTorch (aside.py), so it will not come
        back, and its compile would hold the compile lock Dynamo needs for this call's capture."""
        engine = self.engine
        engine.flush(self._flush_reason, warming=True)
        adoption = engine.adoption
        if self._plain_since != adoption.adoptions:  # adopted since its tensors were last plain
            with engine.interrupts, outside_modes():
                if any(type(t) is DeferredTensor for t in self.tensors):
                    adoption.release((module,))
                    self.tensors = [*module.parameters(), *module.buffers()]
            if not any(type(t) is DeferredTensor for t in self.tensors):
                self._plain_since = adoption.adoptions
        if all_plain(args) and (not kwargs or all_plain(kwargs.values())):
            return args, kwargs  # (the usual call: a batch of plain tensors)
        with engine.interrupts, outside_modes():
            seen: set[int] = set()
            return plain_values(engine, args, seen), plain_values(engine, kwargs, seen)

    def _call_through_dynamo(
        self, module: torch.nn.Module, code: HotCode, args: tuple, kwargs: dict[str, Any]
    ) -> Any:
        """The compiled call. A user's error Dynamo met while tracing is raised again by the call
        as it is, at the user's line; a failure of Dynamo's own refuses the module (recorded
        from its next call on), with one warning."""
        from torch._dynamo.exc import InternalTorchDynamoError, TorchRuntimeError

        try:
            return code.compiled(module, *args, **kwargs)
        except TorchRuntimeError:
            return module._call_impl(*args, **kwargs)
        except InternalTorchDynamoError as error:
            self.engine.hot.refuse(module)
            warnings.warn(
                f"tpunb fused: Dynamo failed on {self.name}'s call ({error}); its calls are recorded "
                "from now on",
                RuntimeWarning,
                stacklevel=5,  # the user's call of the module
            )
            raise

    def _refused_at_first_call(self, module: torch.nn.Module) -> None:
        """Dynamo ran the first call as it is, compiling nothing: this torch's Dynamo does not
        compile here at all (torch 2.8 skips every frame while a Python dispatch mode is on the
        stack, aside or not), so the module's calls are recorded from now on, as with hot
        calls off, rather than run uncompiled for good."""
        self.engine.hot.refuse(module)
        warnings.warn(
            f"tpunb fused: Dynamo ran {self.name}'s call without compiling it (this PyTorch skips "
            f"frames under tpunb's dispatch mode); its calls are recorded from now on",
            RuntimeWarning,
            stacklevel=5,  # the user's call of the module
        )


#: What a hot call's argument may be to be handed to the call as it is.
PLAIN_KINDS = frozenset({torch.Tensor, int, float, bool, str, type(None)})


def all_plain(values: Any) -> bool:
    """Whether every value is of a ``PLAIN_KINDS`` type (a loop, not ``all`` over a generator:
    each call's arguments are asked, every step)."""
    for value in values:  # noqa: SIM110 (the generator costs a frame per call)
        if type(value) not in PLAIN_KINDS:
            return False
    return True


def plain_values(engine: HotPathEngine, value: Any, seen: set[int], depth: int = 0) -> Any:
    """``value`` with tpunb's wrappers replaced by real tensors (the engine has flushed:
    their values are there, or their group's error is raised), containers rebuilt, and
    adopted tensors inside other objects (a cache's layers) released in place, so the
    objects stay the same."""
    kind = type(value)
    if kind is DeferredTensor:
        return engine.materialize(value, "a hot call's argument")
    if isinstance(value, torch.Tensor) or value is None or kind in (int, float, bool, str):
        return value
    if kind in (list, tuple):
        return kind(plain_values(engine, item, seen, depth + 1) for item in value)
    if kind is dict:
        return {key: plain_values(engine, item, seen, depth + 1) for key, item in value.items()}
    release_held(value, seen, depth)
    return value


def release_held(obj: Any, seen: set[int], depth: int) -> None:
    """Release the adopted tensors an argument object holds, down to ``OBJECT_DEPTH``."""
    if depth > config.OBJECT_DEPTH or id(obj) in seen or isinstance(obj, (torch.nn.Module, type)):
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        items = list(obj)
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif hasattr(obj, "__dict__") and not callable(obj):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        if type(item) is DeferredTensor:
            release_tensor(item)
        elif not isinstance(item, (torch.Tensor, int, float, bool, str, type(None))):
            release_held(item, seen, depth + 1)
