"""When a fused group compiles: every rule in one pure function, ``plan``.

A flushed group either runs compiled code the cache holds, or replays its recorded ops one by
one, and may start a compile for next time (on the worker, or first and waited for with
``--sync-compile``). Which one used to be spread over the engine, the cache, the settled-group
test, the hot-call warm-up flag and the storm guard; here it is one decision over plain facts,
so it is table-tested (tests/unit/test_fuse_plan.py) and its reason travels with the group's
record (``FusionGroup.plan``, the monitor row's tooltip).

Modules compiled whole (hotcalls.py, hotsteps.py) are decided per call, not per group: they
are not flushed groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tpunb.fuse.cache import VariantState

#: Sightings of one shape after which it compiles even during a recompile storm.
HOT_SIGHTINGS = 3


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
      until it has come back ``HOT_SIGHTINGS`` times: the fix for a storm (padding to one
      shape) still ends in compiled steps, while one-off shapes keep running op by op.
    """
    if facts.state is VariantState.READY:
        return Decision(Action.RUN_COMPILED, "compiled before")
    if facts.state is VariantState.COMPILING:
        return Decision(Action.REPLAY, "its compile is running in the background")
    if facts.state is VariantState.FAILED:
        return Decision(Action.REPLAY, "its compile failed, or compiling is off")
    if facts.warming:
        return Decision(Action.REPLAY, "recorded in a module call about to be compiled whole")
    if facts.tiny:
        return Decision(Action.REPLAY, "tiny: op by op costs less than a compile would ever repay")
    compile_now = Action.COMPILE_AND_WAIT if facts.sync_compile else Action.COMPILE_IN_BACKGROUND
    if facts.storming:
        if facts.sightings < HOT_SIGHTINGS:
            return Decision(
                Action.REPLAY, f"a recompile storm: a new shape compiles once seen {HOT_SIGHTINGS} times"
            )
        return Decision(compile_now, f"seen {facts.sightings} times during a recompile storm")
    if facts.sync_compile:
        return Decision(compile_now, "--sync-compile: compiled when first seen")
    if facts.repeat:
        return Decision(compile_now, "seen again: compiles for its next run")
    return Decision(Action.REPLAY, "seen once: compiles if it comes back")
