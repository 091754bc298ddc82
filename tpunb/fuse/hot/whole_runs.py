"""What a hot module call (hotcalls.py) and a hot optimizer step (hotsteps.py) share: one
lifecycle around what each runs, and the group rows that show it.

* In a fused scope each runs as strict mode runs it, timed, until its eager runs have cost
  what a compile costs the notebook (payoff.py, plan.py's ``compile_pays_off``):
  ``count_eager_run`` counts such a run toward the compile, publishes one row saying why
  nothing compiles yet (``UNTIL_PAID_FOR``), and adds the time spent around the run to the
  engine's overhead (what the summary line reports where it is noticeable).
* Then it runs through Dynamo, which captures it and hands its graphs to the engine's compiler
  (compilers.py; a training graph on the worker, compile_later.py). ``publish_compiled_run``
  counts each such run in the cache's counters and publishes its row (a miss when Dynamo
  compiled during it, ``eager`` when Dynamo ran it uncompiled, ``compiling`` while its graph
  runs as captured, a hit otherwise), and times its first hits against its eager runs: slower
  compiled, it runs eagerly for good, and a row says so.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import _get_current_dispatch_mode

from tpunb.events import FusionGroup, GroupStatus
from tpunb.fuse import config
from tpunb.fuse.groups.worker import COMPILER_BUSY
from tpunb.fuse.hot.payoff import Payoff
from tpunb.source import locate

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine


def in_fused_scope(engine: HotPathEngine) -> bool:
    """Whether ops issued now belong to ``engine``'s fused scope: its mode on top of the
    stack, or stepped aside between hot calls (aside.py)."""
    # (stepped aside first: between a loop's hot calls it is, and it is the cheaper question)
    return engine.modes.stepped_aside or getattr(_get_current_dispatch_mode(), "engine", None) is engine


def why_run(compiled: int, uncompiled: bool, may_compile: bool, code: Any) -> str | None:
    """A call compiled whole, in words, for its group row: None for a hit and a first compile,
    else why it compiled again or ran as it is (``compiling_only_if_free``: the worker held
    the compiler)."""
    if not (compiled or uncompiled):
        return None
    return why_compiled(compiled, code) if may_compile else COMPILER_BUSY


def why_compiled(compiled: int, code: Any) -> str | None:
    """What made Dynamo compile ``compiled`` graphs for a call of ``code`` (a hot call's
    frame), or run it uncompiled: a failed guard on that code, in words (a shape that changed,
    a flag); None for its first compile (the monitor's "last recompile" reads these).
    Dynamo records one failure per version it checked: of the last call's, a changed shape
    explains it best (the version it failed may differ in something else too, such as the
    mode stack of the cell that compiled it)."""
    from torch._dynamo import config
    from torch._dynamo.utils import guard_failures

    from tpunb.cellcompile import explain_guard

    failed = [explain_guard(f) for f in guard_failures.get(getattr(code, "__code__", None), [])]
    recent = failed[-config.recompile_limit :]
    reason = next((r for r in reversed(recent) if ".shape[" in r), recent[-1] if recent else None)
    if compiled:  # (no guard failed: its first compile, which is no miss: its status says so)
        return f"Dynamo compiled {compiled} graph(s): {reason}" if reason else None
    return (
        f"run uncompiled: Dynamo's limit of {config.recompile_limit} compiled versions was reached "
        f"and this call fits none of them" + (f" ({reason})" if reason else "")
    )


def publish_whole_call(
    engine: HotPathEngine,
    *,
    key: str,
    trigger: str,
    started: float,
    compiled: int,
    uncompiled: bool,
    compiling: bool,
    may_compile: bool,
    compiled_call: Any,
    compile_in_call: bool = False,
    plan: str | None = None,
    eager_ms: float | None = None,
) -> None:
    """Count a call compiled whole (a hot module call, a hot optimizer step) in the cache's
    counters and publish its group record, at the user's line that made it: a miss when
    Dynamo compiled a graph during it, ``eager`` when Dynamo ran it uncompiled, ``compiling``
    while its graph runs as captured, a hit otherwise. A call that ran as it is because the
    worker held the compiler (``may_compile`` false) asked nothing of the cache: its row says
    so, the counters leave it out. ``compile_in_call``: the compile ran inside the call
    (Inductor at once, not on the worker), so its time is the call's. ``plan``: what it does
    from now on, where the caller decided (``UNTIL_PAID_FOR``, proved slower compiled); else
    its row says why Dynamo compiled or ran it as it is. ``eager_ms``: what it
    costs run eagerly, as strict mode runs it (its payoff's eager runs), where known."""
    run_ms = (time.perf_counter() - started) * 1000
    if may_compile or not uncompiled:
        engine.cache.count_whole_call(compiled, run_ms if compiled else 0.0, uncompiled, compiling)
    publish = engine.publish
    if publish is None:
        return
    where = locate()
    missed = None
    if plan is None:
        said = why_run(compiled, uncompiled, may_compile, getattr(compiled_call, "__wrapped__", None))
        # waiting for the compiler is a plan, not a miss's reason: the monitor's "last
        # recompile" and the profile's findings read misses
        plan, missed = (said, None) if said == COMPILER_BUSY else (None, said)
    if compiled:
        status = GroupStatus.MISS
    elif uncompiled:
        status = GroupStatus.OP_BY_OP
    else:
        status = GroupStatus.COMPILING if compiling else GroupStatus.HIT
    publish(
        FusionGroup(
            key=key,
            ops=0,
            top_ops={},
            input_shapes=[],
            trigger=trigger,
            source=str(where) if where else key,
            status=status,
            compile_ms=run_ms if compiled and compile_in_call else None,
            run_ms=run_ms,
            lifted=0,
            miss_reason=missed,
            plan=plan,
            whole_call=True,
            at=where.label if where else None,
            eager_ms=eager_ms,
        )
    )


#: A hot call's or step's row while it runs eagerly: plan.compile_pays_off.
UNTIL_PAID_FOR = (
    "run as strict mode runs it until its runs have cost what a compile would (about "
    f"{config.COMPILE_COST_S:g} s; --sync-compile compiles at once)"
)


def until_paid_for(saving: float) -> str:
    """``UNTIL_PAID_FOR``, and where an earlier definition of the model measured what compiling
    saves a call (``Payoff.saving``), that share."""
    if saving >= 1.0:
        return UNTIL_PAID_FOR
    return (
        f"{UNTIL_PAID_FOR}, counting {saving:.0%} of each run: what compiling saved a call of an "
        "earlier definition of the same code"
    )


def publish_eager(engine: HotPathEngine, key: str, what: str, started: float, plan: str) -> None:
    """The group row of a hot call or step (``what``: "Net call", "AdamW.step()") that runs
    eagerly from now on, by ``plan`` (``UNTIL_PAID_FOR``, or its compiled runs proved
    slower), so that the monitor shows why; the cache's counters leave it out."""
    publish_whole_call(
        engine,
        key=key,
        trigger=f"{what}, run as strict mode runs it",
        started=started,
        compiled=0,
        uncompiled=True,
        compiling=False,
        may_compile=False,
        compiled_call=None,
        plan=plan,
    )


def count_eager_run(
    engine: HotPathEngine,
    payoff: Payoff,
    key: str,
    what: str,
    entered: float,
    started: float,
    weight: float = 1.0,
) -> bool:
    """An eager run of a hot call or step (``what``: "Net call", "AdamW.step()") that started at
    ``started`` has ended: counted toward its compile (``weight`` times), its first run
    published, and the engine's time around it since ``entered`` added to its overhead.
    Returns whether this run (one timed after its compiled runs: ``awaiting_eager``) completed
    the comparison; if it proved them slower, it runs eagerly from now on, and a row says so."""
    spent = time.perf_counter() - started
    judged = payoff.judged
    if payoff.ran_eagerly(spent, weight, quiet=engine.cache.quiet_since(started)):
        publish_eager(engine, key, what, started, until_paid_for(payoff.saving))  # why nothing compiles yet
    judged_now = payoff.judged and not judged
    if judged_now and payoff.slower:
        publish_eager(engine, key, what, started, payoff.slower_reason())
    engine.overhead_s += time.perf_counter() - entered - spent
    return judged_now


def publish_compiled_run(engine: HotPathEngine, payoff: Payoff, what: str, run_s: float, **row: Any) -> bool:
    """A run of a hot call or step (``what``) through Dynamo, published with ``row``
    (``publish_whole_call``'s keywords: its key, trigger, start and what Dynamo did); a hit's
    ``run_s`` is timed against the eager runs. Returns True once, when its first hits prove
    slower than its eager runs: it runs eagerly from now on, and a row says so.

    A run during which Dynamo captured (``compiled``) held the notebook's thread for what its
    eager runs took and the capture on top: 3.9 s in one step of the HF Trainer's 11 ms steps.
    No cell asked for that wait unless it said ``--sync-compile``: it is counted by ``what``
    (``engine.capture_s``), and the summary line says it."""
    publish_whole_call(engine, eager_ms=payoff.eager_ms, **row)
    if row["compiled"] and row["may_compile"] and not engine.options.sync_compile:
        eager_s = statistics.median(payoff.recent_eager_s) if payoff.recent_eager_s else 0.0
        engine.capture_s[what] += max(0.0, run_s - eager_s)
        engine.step_clock.captured()
    if row["compiled"] or row["uncompiled"] or row["compiling"]:
        return False
    if not payoff.ran_compiled(run_s, quiet=engine.cache.quiet_since(row["started"])):
        return False
    publish_eager(engine, row["key"], what, row["started"], payoff.slower_reason())
    return True
