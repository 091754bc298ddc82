"""The flush stage: a trace of recorded ops becomes one group that ran.

The engine hands over a finished trace (its ops, their inputs, the wrappers waiting for
results) and the scope's options; the stages below take and return plain values:

    key      the group's structural key and its variant in the cache (``KeyedGroup``)
    plan     plan.py's ``Decision``: run compiled code, replay op by op, compile for next time
    compile  a job for the worker (cache.py, worker.py) when the decision asks for one
    run      the group's values: compiled code, or its ops replayed one by one (``replay``:
             a first sighting's path, and the fallback when compiled code fails)
    publish  the wrappers get their values; a ``FusionGroup`` record goes to the monitor

A group that fails decides no values: the engine hands its trace to ``abandon``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tpunb.events import FusionGroup, GroupStatus
from tpunb.fuse import config
from tpunb.fuse.errors import FusedOpError, ReplayError, describe_failure, op_location, warn_storm
from tpunb.fuse.groups.cache import (
    NOT_COMPILED,
    CompileJob,
    GraphCache,
    GroupKey,
    Variant,
    VariantState,
    explain_miss,
    short_hash,
)
from tpunb.fuse.groups.compilers import Compile
from tpunb.fuse.groups.graph import build_graph
from tpunb.fuse.groups.plan import Action, Decision, GroupFacts, plan
from tpunb.fuse.options import FuseOptions
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.recording.growing import GrowingInputs
from tpunb.fuse.recording.ops import facts_by_id
from tpunb.fuse.recording.record import KnownSequences
from tpunb.fuse.recording.rng import rng_as_recorded
from tpunb.fuse.recording.settled import tiny
from tpunb.fuse.recording.trace import Input, Node, OpRecord, Ref, Trace, decoder, resolve
from tpunb.fuse.recording.wrapper_meta import as_recorded
from tpunb.source import SourceLocation
from tpunb.value_reads import flush_reason

#: How a group ran, by its variant's state; all but a hit replay op by op.
STATUS_OF = {
    VariantState.READY: GroupStatus.HIT,
    VariantState.SEEN: GroupStatus.OP_BY_OP,
    VariantState.COMPILING: GroupStatus.COMPILING,
    VariantState.FAILED: GroupStatus.OP_BY_OP,
}


@dataclass(frozen=True)
class FlushRequest:
    """Why a trace is flushed, from where, and whether the host waits for its values (a read,
    an op that cannot be deferred) rather than the engine choosing the boundary."""

    reason: str
    where: SourceLocation | None
    wait: bool


@dataclass
class PendingResults:
    """What the trace decides: the refs of its new outputs, the wrappers waiting for them (in
    the same order), and the inputs it writes in place."""

    outputs: list[tuple]
    waiting: list[DeferredTensor]
    written: list[DeferredTensor]


@dataclass(frozen=True)
class KeyedGroup:
    """The key stage's result: where the group sits in the cache, and how it got there."""

    skeleton: GroupKey
    key: tuple
    variant: Variant
    repeat: bool  # its structure was seen before
    first_sighting: bool
    family: int | None  # the op sequence, shapes aside; None on a hit, which never compiles
    why: str | None  # why it missed: what differs from the last of its op sequence

    @property
    def name(self) -> str:
        return short_hash(self.skeleton, self.key)


class GroupFlush:
    """The flush stage's lasting parts: the cache of compiled groups, the recorder's known
    sequences (a trace that followed one finds its key at its end), the growing-inputs
    detector (a shape that grows each step is run at once, not compiled per length) and the
    compiler of groups' graphs (``compile``: graphs without autograd; the engine's compiler's
    ``compile_graph``, Inductor on the native runtime)."""

    def __init__(
        self, cache: GraphCache, known: KnownSequences, growing: GrowingInputs, compile: Compile
    ) -> None:
        self.cache, self.known, self.growing, self.compile = cache, known, growing, compile
        #: the structures sighted in the notebook cell under way (FusionEngine.begin_cell
        #: empties it; without cells, in all): seen again there, a group is a loop's step
        self.in_this_cell: set[GroupKey] = set()

    def run(
        self,
        trace: Trace,
        request: FlushRequest,
        options: FuseOptions,
        publish: Callable[[Any], None] | None,
    ) -> None:
        """Key, plan, (compile,) run and publish one group."""
        __tracebackhide__ = True
        started = time.perf_counter()
        results = pending_results(trace)
        check_versions(trace)
        keyed = self.key(trace, tuple(results.outputs), options)
        small = tiny(trace)
        decision = self.plan(trace, results.outputs, keyed, small, options)
        variant = keyed.variant
        status = GroupStatus.MISS if keyed.first_sighting else STATUS_OF[variant.state]
        self.cache.count(status)
        ran = time.perf_counter()
        with rng_as_recorded(trace):
            values = run_group(trace, results.outputs, variant)
        if status != GroupStatus.HIT:  # op by op: strict's cost
            replayed_ms = (time.perf_counter() - ran) * 1000
            variant.replayed_ms += replayed_ms
            if variant.replay_ms is None:
                variant.replay_ms = replayed_ms
        hand_out(results, values, settled=small)
        if publish is not None:
            publish(group_record(trace, request, keyed, status, decision, started, options))
        self.cache.emit_warnings()

    def key(self, trace: Trace, outputs: tuple, options: FuseOptions) -> KeyedGroup:
        """The group's skeleton and its variant in the cache (a new one on a first sighting),
        counted as sighted once more."""
        skeleton = self.skeleton(trace, outputs)
        lift_dtypes = [s.dtype if s.liftable else None for s in trace.float_slots]
        variant, key, lifted, repeat = self.cache.variant(skeleton, trace.floats, lift_dtypes)
        first_sighting, why, family = variant is None, None, None
        if first_sighting or variant.state is VariantState.SEEN:
            family = hash(tuple([op.key[0] for op in trace.ops]))
        if variant is None:
            variant, why = self.new_variant(trace, skeleton, key, lifted, family, options)
        variant.sightings += 1
        variant.recurs = variant.recurs or skeleton in self.in_this_cell
        self.in_this_cell.add(skeleton)
        return KeyedGroup(skeleton, key, variant, repeat, first_sighting, family, why)

    def skeleton(self, trace: Trace, outputs: tuple) -> GroupKey:
        """The group's structural key. A trace that followed a known sequence to a known end
        finds it there (its ops are the sequence's, so only inputs and outputs are compared);
        others hash every op, and their sequence becomes known."""
        metas = trace.key_metas()
        end = self.known.extend(trace)
        found = end.ends.get((metas, outputs)) if end is not None and end.ends is not None else None
        if found is not None:
            return found
        skeleton = GroupKey((tuple([op.key for op in trace.ops]), metas, outputs, trace.device))
        if end is not None:
            end.ends = end.ends if end.ends is not None else {}
            if len(end.ends) < config.MAX_ENDS:
                end.ends[(metas, outputs)] = skeleton
        return skeleton

    def new_variant(
        self, trace: Trace, skeleton: GroupKey, key: tuple, lifted: dict, family: int, options: FuseOptions
    ) -> tuple[Variant, str | None]:
        """A variant seen for the first time, in the cache from now on, and why it missed:
        what differs from the last of the same op sequence (a shape), or floats that vary."""
        variant, why = Variant(lifted=lifted), None
        previous = self.cache.previous_of_family(family, skeleton)
        if previous is not None:
            why = explain_miss(previous, skeleton)
            self.growing.observe(previous.parts[1], trace)
        elif lifted:
            why = f"{len(lifted)} Python float(s) began to vary: now graph inputs"
        if not options.compile:
            variant.done = NOT_COMPILED
        self.cache.add(skeleton, key, variant)
        return variant, why

    def plan(
        self, trace: Trace, outputs: list, keyed: KeyedGroup, small: bool, options: FuseOptions
    ) -> Decision:
        """plan.py's decision over this group's facts; a compile it asks for starts here."""
        variant, family = keyed.variant, keyed.family
        facts = GroupFacts(
            state=variant.state,
            sightings=variant.sightings,
            repeat=keyed.repeat,
            recurs=variant.recurs,
            replayed_s=variant.replayed_ms / 1000,
            compile_after_s=options.compile_after_s,
            warming=trace.warming,
            tiny=small,
            storming=family is not None and self.cache.storming(family),
            sync_compile=options.sync_compile,
        )
        decision = plan(facts)
        if decision.compiles:
            if self.cache.count_family(family) == config.STORM_VARIANTS:
                warn_storm(trace, config.STORM_VARIANTS)
            wait = decision.action is Action.COMPILE_AND_WAIT
            job = compile_job(trace, outputs, variant, self.compile)
            self.cache.compile(keyed.name, variant, job, wait=wait)
        return decision


def pending_results(trace: Trace) -> PendingResults:
    """The wrappers whose values this trace decides, still alive and still pending."""
    results = PendingResults([], [], [])
    for ref in trace.touched:
        wrapper = ref()
        if wrapper is None or wrapper.pending is None:
            continue
        if type(wrapper.pending) is Node:
            results.outputs.append(wrapper.pending)
            results.waiting.append(wrapper)
        else:
            results.written.append(wrapper)
    return results


def check_versions(trace: Trace) -> None:
    """A real input changed since it was recorded, behind the engine's back: refuse to run."""
    for index, (tensor, version) in enumerate(zip(trace.inputs, trace.input_versions, strict=True)):
        if tensor._version != version:
            user = next((op for op in trace.ops if op.reads(Input(index))), None)
            where = op_location(user) if user else "a recorded op"
            raise FusedOpError(
                f"a tensor read by {where} was changed outside tpunb's view before the group ran "
                "(by another thread, or code that bypasses PyTorch's dispatcher); copy the tensor first"
            )


def compile_job(trace: Trace, outputs: list, variant: Variant, compile: Compile) -> CompileJob:
    """The worker's job for this group: its graph, built from the recorded ops, compiled by
    ``compile``. It holds detached inputs (the worker reads no tensor the notebook changes)."""
    slot_places = {s.place: i for i, s in enumerate(trace.float_slots)}
    examples = [t.detach() for t in trace.inputs]
    if variant.lifted:
        examples.append(torch.zeros(len(variant.lifted), dtype=torch.float64, device=trace.device))
    ops, floats, lifted = trace.ops, list(trace.floats), dict(variant.lifted)

    def job() -> tuple[Callable[..., Any], str]:
        graph = build_graph(ops, len(examples) - bool(lifted), floats, lifted, slot_places, outputs)
        return compile(graph, examples), graph.code

    return job


def run_group(trace: Trace, outputs: list, variant: Variant) -> list[torch.Tensor]:
    """The group's values: its compiled code where the cache has it, else (or if the compiled
    code raised) a replay of its ops, which names the op that failed."""
    done = variant.done
    if done is not None and done.fn is not None:
        args = list(trace.inputs)
        if variant.lifted:
            order = sorted(variant.lifted, key=lambda slot: variant.lifted[slot][0])
            scalars = [trace.floats[slot] for slot in order]
            args.append(torch.tensor(scalars, dtype=torch.float64, device=trace.device))
        try:
            return list(done.fn(*args))
        except Exception:  # find the culprit op by replaying (below)
            pass
    try:
        return replay(trace.ops, trace.inputs, trace.floats, outputs)
    except ReplayError as failure:
        raise FusedOpError(describe_failure(trace, failure)) from failure.error


def replay(
    ops: Sequence[OpRecord], inputs: Sequence[torch.Tensor], floats: Sequence[float], outputs: Sequence[Ref]
) -> list[torch.Tensor]:
    """Run the recorded ops eagerly, one by one; return the values of ``outputs``.

    Each intermediate is dropped after its last use, as eager code drops it: holding all of
    them would put every op on fresh memory (page faults) and make replay far slower than
    strict mode.
    """
    env: list[Any] = [None] * len(ops)
    lookup = decoder(inputs, floats, env, lambda ref, value: value[ref.out])
    last_use = _last_uses(ops, outputs)
    for index, op in enumerate(ops):
        args = [resolve(a, lookup) for a in op.args]
        kwargs = {k: resolve(v, lookup) for k, v in op.kwargs.items()}
        try:
            env[index] = op.func(*args, **kwargs)
        except Exception as error:
            raise ReplayError(index, error, args) from error
        del args, kwargs
        for done in last_use.get(index, ()):
            env[done] = None
    return [lookup(ref) for ref in outputs]


def _last_uses(ops: Sequence[OpRecord], outputs: Sequence[Node]) -> dict[int, list[int]]:
    """op index -> the earlier ops whose results are not needed after it (outputs are kept)."""
    last: dict[int, int] = {index: index for index in range(len(ops))}
    for index, op in enumerate(ops):
        for value in op.args:
            _mark_use(value, index, last)
        for value in op.kwargs.values():
            _mark_use(value, index, last)
    for ref in outputs:
        last.pop(ref.op, None)
    freed: dict[int, list[int]] = {}
    for producer, user in last.items():
        freed.setdefault(user, []).append(producer)
    return freed


def _mark_use(value: Any, user: int, last: dict[int, int]) -> None:
    """``user`` reads the ops ``value`` refers to: their last use so far. (A function of the
    module's: a recursive closure is a reference cycle, garbage only the collector frees, and
    the collector then runs within a later step.)"""
    if type(value) is Node:
        last[value.op] = user
    elif type(value) is tuple:
        for item in value:
            _mark_use(item, user, last)


def hand_out(results: PendingResults, values: list[torch.Tensor], settled: bool) -> None:
    """A group's results to the wrappers waiting for them; written inputs are real again. A
    tiny group's results are ``settled`` (settled.py): later groups treat them as plain."""
    for wrapper, value in zip(results.waiting, values, strict=True):
        wrapper.value, wrapper.pending = as_recorded(wrapper, value), None
        wrapper.from_group = not settled
    for wrapper in results.written:
        wrapper.pending = None


def abandon(trace: Trace, error: BaseException) -> None:
    """A group that failed decides no values: its pending results carry the error (reading
    one raises it), and inputs it would have written keep what they hold."""
    for ref in trace.touched:
        wrapper = ref()
        if wrapper is None or wrapper.pending is None:
            continue
        if type(wrapper.pending) is Node:
            wrapper.error = error
        wrapper.pending = None


def group_record(
    trace: Trace,
    request: FlushRequest,
    keyed: KeyedGroup,
    status: GroupStatus,
    decision: Decision,
    started: float,
    options: FuseOptions,
) -> FusionGroup:
    """The monitor's and the profile's record of one group."""
    counts = Counter(op.key[0] for op in trace.ops)  # by op id: cheaper than names
    histogram = {facts_by_id(i).name.removeprefix("aten."): n for i, n in counts.most_common(5)}
    where, said, variant = request.where, flush_reason(request.reason), keyed.variant
    done = variant.done if status == GroupStatus.MISS and options.sync_compile else None
    return FusionGroup(
        key=keyed.name,
        ops=len(trace.ops),
        top_ops=histogram,
        input_shapes=[list(m[0]) for m in trace.input_metas[:8]],
        trigger=f"{said} at {where.label}" if where else said,
        source=op_location(trace.ops[0]),
        status=status,
        compile_ms=done.compile_ms if done is not None else None,
        run_ms=(time.perf_counter() - started) * 1000,
        capture_ms=trace.capture_s * 1000,
        eager_ms=variant.replay_ms,
        lifted=len(variant.lifted),
        miss_reason=keyed.why,
        plan=decision.reason,
        wait=request.wait,
        at=where.label if where else None,
    )
