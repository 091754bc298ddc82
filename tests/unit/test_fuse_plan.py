"""The plan stage's rules, as tables: when a fused group runs compiled, replays, or compiles;
when a module's calls and an optimizer's step are compiled whole."""

from __future__ import annotations

import dataclasses

import pytest

from tpunb.fuse.config import COMPILE_COST_S, HOT_AFTER, HOT_STEPS_AFTER, STORM_SIGHTINGS
from tpunb.fuse.groups.cache import VariantState
from tpunb.fuse.groups.plan import (
    Action,
    CallAction,
    CallFacts,
    GroupFacts,
    Regime,
    StepAction,
    StepFacts,
    compile_pays_off,
    plan,
    plan_call,
    plan_step,
    runs_whole,
)

SEEN_AGAIN = GroupFacts(
    state=VariantState.SEEN,
    sightings=1,
    repeat=True,
    recurs=True,
    replayed_s=0.001,
    compile_after_s=COMPILE_COST_S,
    warming=False,
    tiny=False,
    storming=False,
    sync_compile=False,
)


def facts(**changes) -> GroupFacts:
    return dataclasses.replace(SEEN_AGAIN, **changes)


@pytest.mark.parametrize(
    ("group", "action"),
    [
        (facts(state=VariantState.READY), Action.RUN_COMPILED),
        (facts(state=VariantState.READY, tiny=True, warming=True), Action.RUN_COMPILED),
        (facts(state=VariantState.COMPILING), Action.REPLAY),
        (facts(state=VariantState.FAILED, sync_compile=True), Action.REPLAY),
        (facts(repeat=False), Action.REPLAY),  # seen once: it may never come back
        (facts(), Action.COMPILE_IN_BACKGROUND),  # seen again in its cell: a loop's step
        # seen again only in another cell (set-up code): once its runs have paid for a compile
        (facts(recurs=False), Action.REPLAY),
        (facts(recurs=False, replayed_s=COMPILE_COST_S), Action.COMPILE_IN_BACKGROUND),
        (facts(recurs=False, compile_after_s=0.0), Action.COMPILE_IN_BACKGROUND),
        (facts(recurs=False, sync_compile=True), Action.COMPILE_AND_WAIT),
        (facts(repeat=False, sync_compile=True), Action.COMPILE_AND_WAIT),
        (facts(tiny=True, sync_compile=True), Action.REPLAY),  # never repays a compile
        (facts(warming=True, sync_compile=True), Action.REPLAY),  # its module compiles whole
        (facts(storming=True, sightings=STORM_SIGHTINGS - 1), Action.REPLAY),
        (facts(storming=True, sightings=STORM_SIGHTINGS - 1, sync_compile=True), Action.REPLAY),
        (facts(storming=True, sightings=STORM_SIGHTINGS), Action.COMPILE_IN_BACKGROUND),
        (
            facts(storming=True, sightings=STORM_SIGHTINGS, repeat=False, sync_compile=True),
            Action.COMPILE_AND_WAIT,
        ),
    ],
)
def test_every_rule_of_when_a_group_compiles(group: GroupFacts, action: Action) -> None:
    decision = plan(group)
    assert decision.action is action
    assert decision.compiles == (action in (Action.COMPILE_IN_BACKGROUND, Action.COMPILE_AND_WAIT))
    assert decision.reason  # every decision says why, in words


TRAINING_CALL = CallFacts(
    regime=Regime.TRAINING,
    holds_tensors=True,
    compile=True,
    hot_training=True,
    calls=1,
    refused=False,
    compiled_elsewhere=False,
    compiles_at_once=True,
)


def call(**changes) -> CallFacts:
    return dataclasses.replace(TRAINING_CALL, **changes)


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        (call(), CallAction.WARM),  # counted; its groups are not compiled
        (call(calls=HOT_AFTER - 1), CallAction.WARM),
        (call(calls=HOT_AFTER), CallAction.HOT_FROM_NEXT_STEP),  # its backward must finish first
        (call(calls=HOT_AFTER, regime=Regime.INFERENCE), CallAction.HOT_FROM_NEXT_CALL),
        (call(calls=HOT_AFTER, regime=Regime.INFERENCE, hot_training=False), CallAction.HOT_FROM_NEXT_CALL),
        (call(calls=HOT_AFTER, hot_training=False), CallAction.RECORD),  # --no-hot-training
        (call(calls=HOT_AFTER, regime=None), CallAction.RECORD),  # grad on in eval mode, say
        (call(calls=HOT_AFTER, compile=False), CallAction.RECORD),
        (call(calls=HOT_AFTER, refused=True), CallAction.RECORD),  # Dynamo failed on it
        (call(calls=HOT_AFTER, compiled_elsewhere=True), CallAction.RECORD),  # nn.Module.compile
        (call(calls=HOT_AFTER, holds_tensors=False), CallAction.RECORD),  # a loss module
        (call(compiles_at_once=False, holds_tensors=False, regime=Regime.INFERENCE), CallAction.RECORD),
        # hot from the first call where a hot call runs eagerly until its compile pays off
        (call(compiles_at_once=False), CallAction.HOT_FROM_NEXT_STEP),
        (call(compiles_at_once=False, regime=Regime.INFERENCE), CallAction.HOT_FROM_NEXT_CALL),
        (call(compiles_at_once=False, hot_training=False), CallAction.RECORD),
    ],
)
def test_every_rule_of_when_a_module_call_is_compiled_whole(facts: CallFacts, action: CallAction) -> None:
    assert plan_call(facts) is action


@pytest.mark.parametrize(
    ("regime", "in_scope", "compile", "hot_training", "whole"),
    [
        (Regime.TRAINING, True, True, True, True),
        (Regime.INFERENCE, True, True, False, True),
        (Regime.TRAINING, True, True, False, False),  # --no-hot-training: recorded
        (None, True, True, True, False),
        (Regime.INFERENCE, False, True, True, False),  # outside fused scopes: the module's own call
        (Regime.INFERENCE, True, False, True, False),
    ],
)
def test_when_a_hot_modules_call_runs_compiled(regime, in_scope, compile, hot_training, whole) -> None:
    assert runs_whole(regime, in_scope, compile, hot_training) is whole


EAGER_STEP = StepFacts(compile=True, hot_training=True, steps=1, refused=False, traceable=True)


def step(**changes) -> StepFacts:
    return dataclasses.replace(EAGER_STEP, **changes)


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        (step(), StepAction.COUNT),
        (step(steps=HOT_STEPS_AFTER), StepAction.HOT_FROM_NEXT_STEP),
        (step(steps=HOT_STEPS_AFTER, hot_training=False), StepAction.AS_IS),
        (step(steps=HOT_STEPS_AFTER, compile=False), StepAction.AS_IS),
        (step(steps=HOT_STEPS_AFTER, refused=True), StepAction.AS_IS),
        (step(steps=HOT_STEPS_AFTER, traceable=False), StepAction.AS_IS),  # fused=True, differentiable
    ],
)
def test_every_rule_of_when_an_optimizer_step_is_compiled_whole(facts: StepFacts, action: StepAction) -> None:
    assert plan_step(facts) is action


@pytest.mark.parametrize(
    ("eager_s", "sync_compile", "after_s", "compiles"),
    [
        (0.0, False, COMPILE_COST_S, False),  # eager runs have not paid for a compile yet
        (COMPILE_COST_S * 0.99, False, COMPILE_COST_S, False),
        (COMPILE_COST_S, False, COMPILE_COST_S, True),  # rent or buy: they cost what a compile costs
        (0.0, True, COMPILE_COST_S, True),  # --sync-compile: compiled at once
        (0.0, False, 0.0, True),  # FuseOptions(compile_after_s=0): compiled at once, in the background
    ],
)
def test_a_hot_call_or_step_compiles_once_its_eager_runs_cost_a_compile(
    eager_s, sync_compile, after_s, compiles
):
    assert compile_pays_off(eager_s, sync_compile, after_s) is compiles


def test_a_group_records_the_plan_it_ran_by():
    """The engine publishes the decision's reason with each group (the monitor's tooltip)."""
    import torch

    from tpunb.events import EventBus
    from tpunb.fuse import FuseOptions, FusionEngine

    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    w = torch.randn(256, 256)  # not tiny (settled.py)
    with engine.scope(FuseOptions(sync_compile=False)):
        for _ in range(3):
            (w @ w).relu().sum().item()
    plans = [group.plan for group in bus.recent("group", 3)]
    assert plans[:2] == ["seen once: compiles if it comes back", "seen again: compiles for its next run"], (
        plans
    )


def test_a_group_that_comes_back_once_a_cell_compiles_once_its_runs_have_paid_for_it():
    """A cell's set-up (a model's initialization in a script run again) comes back once a run;
    compiled on its second sighting it ran on the worker beside the next run's loop. It runs
    op by op until its runs have cost what a compile would; a loop's step in the same cells
    compiles when seen again, as before."""
    import torch

    from tpunb.events import EventBus
    from tpunb.fuse import FuseOptions, FusionEngine
    from tpunb.fuse.groups.plan import ONCE_A_CELL

    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    w = torch.randn(256, 256)  # not tiny (settled.py)
    plans: list[list[str]] = []
    for _ in range(3):  # a cell run three times: its set-up once, its loop twice
        engine.begin_cell()  # (the session's, as each cell starts)
        with engine.scope(FuseOptions(sync_compile=False)):
            (w * 3).tanh().sum().item()  # set-up
            for _ in range(2):
                (w @ w).relu().sum().item()  # a loop's step
        plans.append([group.plan for group in bus.recent("group", 3)])
        engine.cache.wait_idle()
    assert plans[0][2] == "seen again: compiles for its next run", plans
    assert [run[0] for run in plans[1:]] == [ONCE_A_CELL, ONCE_A_CELL], plans
    assert plans[2][1:] == ["compiled before", "compiled before"], plans
    engine.begin_cell()
    with engine.scope(FuseOptions(sync_compile=False, compile_after_s=0.0)):  # tests of compiled code
        (w * 3).tanh().sum().item()
    assert bus.recent("group", 1)[0].plan == "seen again: compiles for its next run"
    for _ in range(2):  # without cells (a script's scopes, one a step): a loop's step, as before
        with engine.scope(FuseOptions(sync_compile=False)):
            (w - 1).tanh().sum().item()
    assert bus.recent("group", 1)[0].plan == "seen again: compiles for its next run"
