"""When fused mode compiles: every rule, as pure functions over plain facts.

* ``plan``: a flushed group either runs compiled code the cache holds, or replays its recorded
  ops one by one, and may start a compile for next time (on the worker, or first and waited
  for with ``--sync-compile``).
* ``plan_call``: a module's outermost call in a fused scope is recorded, or counted toward
  being compiled whole (hotcalls.py), and turns hot at its ``HOT_AFTER``-th call (its first
  where hot calls wait for their compile to pay off); ``runs_whole`` says whether a hot
  module's call runs whole now.
* ``plan_step``: an optimizer's eager step over plain parameters counts toward its step being
  compiled whole (hotsteps.py), from the ``HOT_STEPS_AFTER``-th on.
* ``compile_pays_off``: whether a hot call or step is compiled now, or runs eagerly once more
  (as strict mode runs it) because its compile has not yet paid off; ``compiled_is_slower``:
  whether, compiled, it proved slower than eager, and runs eagerly for good (payoff.py).

These used to be spread over the engine, the cache, the settled-group test, the hot-call
warm-up flag, the storm guard and the hot calls' and steps' own checks; here they are table-tested
(tests/unit/test_fuse_plan.py), and a group's reason travels with its record
(``FusionGroup.plan``, the monitor row's tooltip).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tpunb.fuse import config
from tpunb.fuse.groups.cache import VariantState

#: A group's reason while it comes back once a cell and its runs have not paid for a compile.
ONCE_A_CELL = (
    "seen once a cell: compiles once its op-by-op runs have cost what a compile would "
    f"(about {config.COMPILE_COST_S:g} s)"
)
#: A warming group's reason: recorded where the next runs are a hot call's or step's.
WARMING = "recorded in a module call about to be compiled whole"


class Action(StrEnum):
    RUN_COMPILED = "run compiled"
    REPLAY = "replay"  # op by op, as strict mode runs them
    COMPILE_IN_BACKGROUND = "compile in the background"  # and replay meanwhile
    COMPILE_AND_WAIT = "compile and wait"  # then run compiled


@dataclass(frozen=True)
class GroupFacts:
    """What ``plan`` needs to know about one flushed group."""

    state: VariantState  # of its cache variant (FAILED also when compiling is off)
    sightings: int  # of this variant, this one included
    repeat: bool  # its structure was seen before (the cache's skeletons)
    recurs: bool  # sighted twice in one cell (a loop's step), not once a cell (set-up)
    replayed_s: float  # what its sightings so far cost run op by op
    compile_after_s: float  # FuseOptions.compile_after_s: what a compile costs the notebook
    warming: bool  # recorded in a call of a module about to be compiled whole (hotcalls.py)
    tiny: bool  # settled.tiny: a few ops on small tensors
    storming: bool  # its op sequence has compiled for STORM_VARIANTS shapes already
    sync_compile: bool  # --sync-compile


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # in words, for the monitor and the profile

    @property
    def compiles(self) -> bool:
        return self.action in (Action.COMPILE_IN_BACKGROUND, Action.COMPILE_AND_WAIT)


def plan(facts: GroupFacts) -> Decision:
    """How this group runs now, and whether it compiles: compiled code runs where the cache
    has it; otherwise a group compiles on its second sighting (its first with
    ``sync_compile``: benchmarks and tests that measure compiled code), except

    * a *tiny* group, which runs op by op in tens of microseconds, so a compile of a second or
      more would take tens of thousands of runs to repay (a ``generate()`` call's checks of its
      inputs, its stopping criteria);
    * a *warming* one, recorded in a call of a module about to be compiled whole, which will
      not come back;
    * during a recompile storm (an op sequence already compiled for many shapes), a new shape
      until it has come back ``STORM_SIGHTINGS`` times: the fix for a storm (padding to one
      shape) still ends in compiled steps, while one-off shapes keep running op by op;
    * a group that comes back once a cell, not within one (a model's initialization in a
      cell or script run again, its adoption), until its op-by-op runs have cost what a
      compile costs the notebook (``compile_pays_off``, rent or buy, as hot calls do): a few
      milliseconds a run repay a compile only after hundreds of runs, and compiled on the
      worker while the next run's loop runs, it slowed that run (a word-level LSTM script
      run again with ``%run``: 2.2 s against strict's 1.1 s, its hot calls waiting for the
      compiler). A loop's step recurs within its cell and compiles when seen again.
    """
    if facts.state is VariantState.READY:
        return Decision(Action.RUN_COMPILED, "compiled before")
    if facts.state is VariantState.COMPILING:
        return Decision(Action.REPLAY, "its compile is running in the background")
    if facts.state is VariantState.FAILED:
        return Decision(Action.REPLAY, "its compile failed, or compiling is off")
    if facts.warming:
        return Decision(Action.REPLAY, WARMING)
    if facts.tiny:
        return Decision(Action.REPLAY, "tiny: op by op costs less than a compile would ever repay")
    compile_now = Action.COMPILE_AND_WAIT if facts.sync_compile else Action.COMPILE_IN_BACKGROUND
    if facts.storming:
        if facts.sightings < config.STORM_SIGHTINGS:
            return Decision(
                Action.REPLAY,
                f"a recompile storm: a new shape compiles once seen {config.STORM_SIGHTINGS} times",
            )
        return Decision(compile_now, f"seen {facts.sightings} times during a recompile storm")
    if facts.sync_compile:
        return Decision(compile_now, "--sync-compile: compiled when first seen")
    once_a_cell = facts.repeat and not facts.recurs
    if once_a_cell and not compile_pays_off(facts.replayed_s, False, facts.compile_after_s):
        return Decision(Action.REPLAY, ONCE_A_CELL)
    if facts.repeat:
        return Decision(compile_now, "seen again: compiles for its next run")
    return Decision(Action.REPLAY, "seen once: compiles if it comes back")


class Regime(StrEnum):
    """A hot call's two regimes: generation and evaluation, and a training step's forward."""

    INFERENCE = "inference"  # no grad, in eval mode
    TRAINING = "training"  # grad, in train mode


class CallAction(StrEnum):
    RECORD = "record"  # as any code: not a call that turns hot
    WARM = "record, warming"  # counted; what it records is not compiled (it will not come back)
    HOT_FROM_NEXT_CALL = "compiled whole from its next call"
    HOT_FROM_NEXT_STEP = "compiled whole from the next optimizer step"  # its backward is done


@dataclass(frozen=True)
class CallFacts:
    """What ``plan_call`` needs to know about one outermost module call in a fused scope."""

    regime: Regime | None  # None: a mix (no grad in train mode, say), which stays recorded
    holds_tensors: bool  # it has parameters or buffers (not a loss, an activation)
    compile: bool  # FuseOptions.compile
    hot_training: bool  # FuseOptions.hot_training
    calls: int  # its outermost calls in fused scopes so far, this one included
    refused: bool  # Dynamo failed on it: recorded for good
    compiled_elsewhere: bool  # its call is compiled already (by tpunb, or nn.Module.compile)
    compiles_at_once: bool  # a hot call compiles from its first run (compile_pays_off with nothing spent)


def plan_call(facts: CallFacts) -> CallAction:
    """How an outermost module call in a fused scope runs, and what it makes of the module.

    A module is hot from its first call where a hot call runs eagerly until compiling it pays
    off (``compile_pays_off``, the default): recording calls before would only cost time (a
    recorded call of a small model costs tens of times its eager run). Where hot calls compile
    at once (``--sync-compile``, ``compile_after_s=0``), calls are recorded until the
    ``HOT_AFTER``-th: a module called once or twice is not worth a compile.

    A training call turns hot at the next optimizer step (or scope start), not at once: making
    it hot releases its adopted parameters, which would poison the autograd graph of a call
    recorded earlier in the same step. A module that holds no tensors (a loss, an activation)
    is code like any other: whether a loop calls ``nn.CrossEntropyLoss()`` or
    ``F.cross_entropy`` must not matter, and a hot call of its own (its wrapper, its timing)
    cost more than the loss itself (hotcalls.py's ``holds_tensors``)."""
    regime_counts = facts.regime is Regime.INFERENCE or (
        facts.regime is Regime.TRAINING and facts.hot_training
    )
    counts = facts.compile and regime_counts and facts.holds_tensors
    if not counts or facts.compiled_elsewhere or facts.refused:
        return CallAction.RECORD
    if facts.calls < (config.HOT_AFTER if facts.compiles_at_once else 1):
        return CallAction.WARM
    if facts.regime is Regime.TRAINING:
        return CallAction.HOT_FROM_NEXT_STEP
    return CallAction.HOT_FROM_NEXT_CALL


def runs_whole(regime: Regime | None, in_fused_scope: bool, compile: bool, hot_training: bool) -> bool:
    """Whether a hot module's call runs compiled whole now: in a fused scope, compiling, in one
    of its regimes (training only with hot training on); otherwise it is the module's own call."""
    if regime is None or not in_fused_scope or not compile:
        return False
    return regime is Regime.INFERENCE or hot_training


def compile_pays_off(eager_s: float, sync_compile: bool, after_s: float) -> bool:
    """Whether a hot call or step is compiled now (``--sync-compile``: always), or runs eagerly
    once more, as strict mode would, having cost ``eager_s`` seconds run so until now.

    Rent or buy: a compile costs the notebook about ``COMPILE_COST_S`` (``after_s``: the
    scope's ``FuseOptions.compile_after_s``) whatever it saves later, so it starts once the
    eager runs have cost as much. A loop that ends sooner (a short cell,
    one ``generate()`` of a small model) never paid for a compile, and one that runs on
    spends at most twice what compiling at once would have (the ski-rental bound)."""
    return sync_compile or eager_s >= after_s


def compiled_is_slower(compiled_s: float, eager_s: float) -> bool:
    """Whether a hot call or step, compiled, runs slower (``compiled_s``, the median of its
    first ``COMPARED_RUNS`` compiled runs) than it ran eagerly (``eager_s``, the median of its
    last as many eager runs): then
    it runs eagerly for good. Dynamo's guards and wrapper cost about 0.7 ms a call here, more
    than a small model's forward, and no compile gets that back."""
    return compiled_s > eager_s


class StepAction(StrEnum):
    AS_IS = "eager, not counted"  # not a step that is compiled whole
    COUNT = "eager, counted toward compiling its step"
    HOT_FROM_NEXT_STEP = "compiled whole from its next step"


@dataclass(frozen=True)
class StepFacts:
    """What ``plan_step`` needs to know about an optimizer's eager step over plain parameters
    (a hot module's) in a fused scope, whose step is not a hot step yet."""

    compile: bool  # FuseOptions.compile
    hot_training: bool  # FuseOptions.hot_training
    steps: int  # its counted eager steps so far, this one included
    refused: bool  # Dynamo failed on it, or ran it uncompiled: eager for good
    traceable: bool  # its groups are neither differentiable nor PyTorch's fused kernels


def plan_step(facts: StepFacts) -> StepAction:
    """Whether the step counts toward compiling the optimizer's step whole (PyTorch's
    compiled-optimizer recipe), and whether its next step is: from the ``HOT_STEPS_AFTER``-th."""
    if not (facts.compile and facts.hot_training and facts.traceable and not facts.refused):
        return StepAction.AS_IS
    return StepAction.HOT_FROM_NEXT_STEP if facts.steps >= config.HOT_STEPS_AFTER else StepAction.COUNT
