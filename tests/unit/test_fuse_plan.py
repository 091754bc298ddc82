"""The plan stage's rules, as a table: when a fused group runs compiled, replays, or compiles."""

from __future__ import annotations

import dataclasses

import pytest

from tpunb.fuse.cache import VariantState
from tpunb.fuse.plan import HOT_SIGHTINGS, Action, GroupFacts, plan

SEEN_AGAIN = GroupFacts(
    state=VariantState.SEEN,
    sightings=1,
    repeat=True,
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
        (facts(), Action.COMPILE_IN_BACKGROUND),  # seen again
        (facts(repeat=False, sync_compile=True), Action.COMPILE_AND_WAIT),
        (facts(tiny=True, sync_compile=True), Action.REPLAY),  # never repays a compile
        (facts(warming=True, sync_compile=True), Action.REPLAY),  # its module compiles whole
        (facts(storming=True, sightings=HOT_SIGHTINGS - 1), Action.REPLAY),
        (facts(storming=True, sightings=HOT_SIGHTINGS - 1, sync_compile=True), Action.REPLAY),
        (facts(storming=True, sightings=HOT_SIGHTINGS), Action.COMPILE_IN_BACKGROUND),
        (
            facts(storming=True, sightings=HOT_SIGHTINGS, repeat=False, sync_compile=True),
            Action.COMPILE_AND_WAIT,
        ),
    ],
)
def test_every_rule_of_when_a_group_compiles(group: GroupFacts, action: Action) -> None:
    decision = plan(group)
    assert decision.action is action
    assert decision.compiles == (action in (Action.COMPILE_IN_BACKGROUND, Action.COMPILE_AND_WAIT))
    assert decision.reason  # every decision says why, in words


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
