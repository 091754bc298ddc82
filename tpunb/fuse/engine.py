"""The native defer-and-fuse engine: record ops, flush them as one compiled group.

Per op (``dispatch``), one of three things happens:

* **record** it: the usual case, in record.py. An op that is the next step of a sequence
  recorded before (a repeated training or decode step) is only checked against that step
  and gets its recorded outputs (the known path); any other op is recorded the new way:
  meta inference gives the outputs' shapes at once (and raises shape errors on the user's
  line). Either way outputs are pending DeferredTensors.
* **run it eagerly**, flushing first when the op touches pending values: ops that need data
  (``item``, ``nonzero``, masks), have no meta kernel, write into a tensor the engine does
  not own, or change device, and JAX ops (``tpunb.jax_op``: JAX compiles those itself).
  A slower answer, never a wrong one.
* **run it as bookkeeping**: ops on 0-dim tensors only (an optimizer's step counter) with
  nothing pending run eagerly without a flush, so ``step.item()`` does not cut the group;
  but reading a value an earlier group computed (``loss.item()``) ends the group, keeping
  groups aligned with the user's steps. Views of the user's plain tensors (a DataLoader
  indexing its dataset) also run as they are: they are metadata only.

Above ops, a module called again and again (a decode step, an evaluation batch, a training
step's forward) stops being recorded: hotcalls.py compiles its call whole with Dynamo, an
optimizer stepping its parameters has its step compiled whole too (hotsteps.py), and the loop
around them runs with the engine's mode off the stack until it is needed (aside.py).

``flush`` turns the trace into a group: key it (from the end of its known sequence when it
followed one), plan it (plan.py: run compiled, replay, or replay and compile for next time,
on the worker: cache.py, worker.py), run it, hand the results to the waiting wrappers, and
publish a FusionGroup record.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from tpunb.events import CompileDone, FusionGroup, GroupStatus
from tpunb.fuse.adopt import Adoption
from tpunb.fuse.aside import ModeStack
from tpunb.fuse.cache import (
    STORM_VARIANTS,
    GraphCache,
    GroupKey,
    Variant,
    VariantState,
    explain_miss,
    short_hash,
)
from tpunb.fuse.compile_later import donated_buffers_off
from tpunb.fuse.deferred import DeferredTensor, same_objects, written_argument
from tpunb.fuse.errors import (
    FusedOpError,
    check_not_failed,
    describe_failure,
    op_location,
    reads_input,
    warn_storm,
)
from tpunb.fuse.graph import ReplayError, build_graph, inductor_compile, replay
from tpunb.fuse.growing import GrowingInputs
from tpunb.fuse.hotcalls import HotCalls
from tpunb.fuse.hotsteps import HotSteps
from tpunb.fuse.interrupts import InterruptGuard
from tpunb.fuse.meta import MetaCache, NotDeferrable
from tpunb.fuse.ops import OpFacts, facts, facts_by_id
from tpunb.fuse.plan import Action, Decision, GroupFacts, plan
from tpunb.fuse.record import MAX_ENDS, NOT_FOLLOWED, Recorder
from tpunb.fuse.rng import rng_as_recorded
from tpunb.fuse.scan import ArgumentScan, all_scalar, is_argument, run_on_values, tensor_leaves
from tpunb.fuse.settled import NO_TENSORS, PLAIN, mark, settled_arguments, small, tiny
from tpunb.fuse.trace import Trace, tensor_meta
from tpunb.fuse.workarounds import skip_dynamo_in
from tpunb.fuse.wrapper_meta import INPLACE_VIEWS, STORAGE_CHANGING, as_recorded, restride
from tpunb.modes import HOT_TRAINING_BY_DEFAULT
from tpunb.source import SourceLocation, locate, user_frame
from tpunb.value_reads import flush_reason

#: Default bound on ops per group: compile time grows with graph size (research/fusion.md).
MAX_OPS = 1000


@dataclass(frozen=True)
class FuseOptions:
    sync_compile: bool = False  # compile on the first sighting, and wait (benchmarks, tests)
    compile: bool = True  # False: every group replays op by op (isolates recording from Inductor)
    # a module trained again and again is compiled whole, forward and backward (hotcalls.py),
    # and the optimizer stepping it too (hotsteps.py); False records every training call
    hot_training: bool = HOT_TRAINING_BY_DEFAULT
    max_ops: int = MAX_OPS


class FuseMode(TorchDispatchMode):
    """Routes every op issued in a fused scope to the engine."""

    def __init__(self, engine: FusionEngine) -> None:
        super().__init__()
        self.engine = engine

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True
        return self.engine.dispatch(func, args, kwargs or {})

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Asked once, as the class is made: whether torch should wrap ``__torch_dispatch__``
        to keep Dynamo out of it. Marking its code does the same at no cost per op."""
        return not skip_dynamo_in(cls.__dict__["__torch_dispatch__"].__code__)


class FusionEngine:
    def __init__(self, device: torch.device, publish: Any = None) -> None:
        self.device = torch.device(device)
        # where group records go; None: none is built (a benchmark timing the engine alone)
        self.publish = publish
        self.trace = Trace()
        self.meta = MetaCache()
        self.cache = GraphCache(self._compiled)
        self.options = FuseOptions()
        self.groups = 0
        # ops, by how they ran: recorded the new way, followed a known sequence, run eagerly
        self.counts = {"recorded": 0, "followed": 0, "eager": 0, "bookkeeping": 0}
        self.recorder = Recorder(self, self.flush)
        self.growing = GrowingInputs()
        self.adoption = Adoption(self)
        self.hot = HotCalls(self)
        self.hot_steps = HotSteps(self)
        self.modes = ModeStack()
        self.interrupts = InterruptGuard()

    # --- scopes -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self, options: FuseOptions, adopt: tuple[Any, ...] = ()) -> Iterator[None]:
        """Record ops issued inside; flush at the end (also when the block raises)."""
        previous, self.options = self.options, options
        with self.interrupts.installed():
            try:
                self.hot.turn_hot()
                self.adopt(*adopt)
                with (
                    self.adoption.active(),
                    self.hot.hooks.installed(),
                    donated_buffers_off(),
                    self.modes.entered(FuseMode(self)),
                ):
                    yield
            finally:
                try:
                    self.flush("end of fused block")
                finally:
                    self.options = previous

    def adopt(self, *objects: Any) -> int:
        """Make modules' parameters and buffers and optimizers' state deferred-capable, in place.

        The tensors keep their identity (``torch.utils.swap_tensors``), so references held
        by a module, an optimizer or the user stay valid; updates to them then fuse instead
        of forcing a flush. Returns how many tensors were adopted.
        """
        with self.interrupts:
            return self.adoption.adopt(objects)

    def release(self, *objects: Any) -> int:
        """Undo ``adopt``: outside fused scopes every op on an adopted tensor pays a Python
        dispatch, and Dynamo (compile mode, hot calls) sees a tensor subclass; plain tensors
        cost neither. Returns how many tensors became plain."""
        with self.interrupts:
            return self.adoption.release(objects)

    # --- per op -----------------------------------------------------------------------------

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict[str, Any]) -> Any:
        __tracebackhide__ = True
        op = facts(func)
        if op.may_settle and (settled := settled_arguments(args, kwargs, self.trace.dirty_storages)):
            # a loop's small bookkeeping around its model, and factories, run at once
            # (settled.py): nothing is recorded, so no interrupt needs holding
            if settled == NO_TENSORS:
                out = func(*args, **kwargs)
                if not small(out):
                    self.counts["eager"] += 1
                    return self._wrap_new(out, args, kwargs)
            else:
                out = func(*args, **kwargs) if settled == PLAIN else run_on_values(func, args, kwargs)
            self.counts["bookkeeping"] += 1
            return mark(out)
        trace, started = self.trace, time.perf_counter()
        with self.interrupts:  # an interrupt waits until the op is recorded or run
            try:
                return self._dispatch(func, op, args, kwargs)
            finally:
                if self.trace is trace:  # (an op that flushed is counted with its group's run)
                    trace.capture_s += time.perf_counter() - started

    def _dispatch(self, func: torch._ops.OpOverload, op: OpFacts, args: tuple, kwargs: dict[str, Any]) -> Any:
        __tracebackhide__ = True
        if func is READ_SCALAR and (value := self._settled_value(args[0])) is not None:
            self.counts["bookkeeping"] += 1
            return func(value)
        result = self.recorder.follow(func, args, kwargs)
        if result is not NOT_FOLLOWED:
            return result
        scan = ArgumentScan()
        masked = op.floats_keep_metadata
        signature = (op.id, scan.signature(args, masked), scan.signature(kwargs, masked))
        if not scan.tensors and not op.returns_tensor:
            return func(*args, **kwargs)  # profiler markers and the like
        if scan.unsupported or op.boundary or op.name in STORAGE_CHANGING:
            return self._eager(func, op, args, kwargs, scan)
        if op.view_only and not scan.wrapped:
            # A view of the user's own tensors (a DataLoader indexing its dataset, say) is
            # metadata only, and plain tensors are never written inside a group, so it needs
            # no flush; recording it would bake its indices into the key of every batch.
            self.counts["bookkeeping"] += 1
            out = func(*args, **kwargs)
            return mark(out) if func is LIFT_FRESH else out  # torch.tensor(data) made here: settled.py
        try:
            outputs = self.meta.outputs(
                signature if scan.hashable else None, func, args, kwargs, scan.metas, op.has_device_arg
            )
        except NotDeferrable:
            outputs = NotDeferrable
        if not scan.pending and scan.all_scalar and (outputs is NotDeferrable or all_scalar(outputs)):
            return self._eager(func, op, args, kwargs, scan, bookkeeping=True)
        if outputs is NotDeferrable:
            return self._eager(func, op, args, kwargs, scan)
        device = self._device_of(args, kwargs, scan)
        if device is None or scan.writes_real(op, args, kwargs):
            return self._eager(func, op, args, kwargs, scan)
        where = _code_and_line(user_frame(sys._getframe()))
        if self.growing.covers(func, *where):
            # its input grows every step (growing.py): run it now, flushing only if it must;
            # its results stay plain, so a group reads them as copies if small (trace.py)
            return mark(self._eager(func, op, args, kwargs, scan, bookkeeping=True, wrap=False))
        return self.recorder.record(func, op, args, kwargs, outputs, device, where)

    def _settled_value(self, tensor: Any) -> torch.Tensor | None:
        """The value ``.item()`` of ``tensor`` reads, when it needs nothing from the trace: a
        plain tensor or a materialized one that no pending op writes and no group computed
        (an optimizer's step counter). The general path would decide the same (bookkeeping,
        no flush), in a tenth of the time. None otherwise."""
        kind = type(tensor)
        if kind is DeferredTensor:
            if tensor._pending is not None or tensor._from_group:
                return None
            value = tensor._value
        elif kind is torch.Tensor and tensor.layout is torch.strided and not tensor.is_nested:
            value = tensor
        else:
            return None
        dirty = self.trace.dirty_storages
        if value is None or (dirty and value.untyped_storage().data_ptr() in dirty):
            return None
        return value

    def _device_of(self, args: tuple, kwargs: dict[str, Any], scan: ArgumentScan) -> torch.device | None:
        """The device the op runs on, or None when it spans devices (run those eagerly).
        0-dim tensors may sit on another device, as in eager PyTorch."""
        devices = scan.devices or {t.device for t in scan.tensors}
        requested = kwargs.get("device")
        if requested is not None:
            devices = devices | {torch.device(requested)}
        if len(devices) > 1:
            return None
        return devices.pop() if devices else torch.device("cpu")

    def _eager(
        self,
        func: torch._ops.OpOverload,
        op: OpFacts,
        args: tuple,
        kwargs: dict[str, Any],
        scan: ArgumentScan,
        bookkeeping: bool = False,
        wrap: bool = True,
    ) -> Any:
        __tracebackhide__ = True
        self.counts["bookkeeping" if bookkeeping else "eager"] += 1
        if (
            self.trace.ops
            and (not bookkeeping or scan.hazard(self.trace, op, args, kwargs) or reads_group_result(op, scan))
            and not (bookkeeping and self._write_keeps_group(op, args, kwargs, scan))
        ):
            self.flush(op.name, wait=True)
        out = run_on_values(func, args, kwargs)
        if op.name in STORAGE_CHANGING or op.name in INPLACE_VIEWS:
            self._refresh_metadata(args, kwargs, op)
        out = same_objects(func, args, kwargs, out)
        return self._wrap_new(out, args, kwargs) if wrap else out

    def _write_keeps_group(
        self, op: OpFacts, args: tuple, kwargs: dict[str, Any], scan: ArgumentScan
    ) -> bool:
        """A bookkeeping op that writes small plain tensors the trace reads (a position counter)
        can run without ending the group: the trace keeps copies of the values it read."""
        if not op.mutated or reads_group_result(op, scan):
            return False
        for where in op.mutated:
            for target in tensor_leaves(written_argument(args, kwargs, where), plain=True):
                if not self.trace.keep_read_value(target):
                    return False
        return not scan.hazard(self.trace, op, args, kwargs)

    def _refresh_metadata(self, args: tuple, kwargs: dict[str, Any], op: OpFacts) -> None:
        """After an eager op changed a wrapped value's view or storage, match the wrapper."""
        for where in op.mutated:
            for wrapper in tensor_leaves(written_argument(args, kwargs, where)):
                restride(wrapper, tensor_meta(wrapper._value))

    def _wrap_new(self, out: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Results of an eager op become materialized wrappers, so later in-place ops on them
        can still be recorded; arguments handed back (in-place results) stay as they are."""
        if isinstance(out, DeferredTensor) or is_argument(out, args, kwargs):
            return out
        if isinstance(out, torch.Tensor):
            # conjugate and negative views stay plain: a wrapper would drop their bit (meta.py)
            plain = (
                out.device != self.device
                or out.layout != torch.strided
                or out.is_nested
                or out.is_conj()
                or out.is_neg()
            )
            return out if plain else DeferredTensor.wrap(out, self)
        if isinstance(out, (list, tuple)):
            return type(out)(self._wrap_new(o, args, kwargs) for o in out)
        return out

    # --- materialization ----------------------------------------------------------------------

    def materialize(self, wrapper: DeferredTensor, reason: str) -> torch.Tensor:
        check_not_failed(wrapper)
        if wrapper._pending is not None or (
            wrapper._value is not None
            and self.trace.dirty_storages
            and wrapper._value.untyped_storage().data_ptr() in self.trace.dirty_storages
        ):
            self.flush(reason, wait=True)
        check_not_failed(wrapper)
        return wrapper._value

    def flush(self, reason: str, wait: bool = False) -> None:
        """Run everything recorded so far as one group; ``wait``: because the host needs
        values now (a read, an op that cannot be deferred), not at a boundary of the engine's."""
        __tracebackhide__ = True
        if not self.trace.ops:
            return
        # the group's own ops are not recorded; an interrupt waits until its results are handed
        # out; autocast already chose each recorded op's dtypes, so it must not cast them again
        # (a flush from Python code, not from inside an op: an optimizer hook, a hot call)
        with self.interrupts, _disable_current_modes(), torch.no_grad(), torch._C._DisableAutocast():
            trace, self.trace = self.trace, Trace(warming=self.hot.warming)
            try:
                self._flush(trace, reason, locate(sys._getframe(1)), wait)
            except BaseException as error:  # failed: its results are lost, inputs stay real
                abandon(trace, error)
                raise

    def _flush(self, trace: Trace, reason: str, where: SourceLocation | None, wait: bool) -> None:
        __tracebackhide__ = True
        started = time.perf_counter()
        outputs, waiting, written = [], [], []
        for ref in trace.touched:
            wrapper = ref()
            if wrapper is None or wrapper._pending is None:
                continue
            if wrapper._pending[0] == "n":
                outputs.append(wrapper._pending)
                waiting.append(wrapper)
            else:
                written.append(wrapper)
        self._check_versions(trace)
        skeleton = self._skeleton(trace, tuple(outputs))
        lift_dtypes = [s.dtype if s.liftable else None for s in trace.float_slots]
        variant, key, lifted, repeat = self.cache.variant(skeleton, trace.floats, lift_dtypes)
        why, first_sighting = None, variant is None
        family = None  # the op sequence, shapes aside; hits skip the bookkeeping it serves
        if first_sighting or variant.state is VariantState.SEEN:
            family = hash(tuple([op.key[0] for op in trace.ops]))
        if variant is None:
            variant, why = self._new_variant(trace, skeleton, key, lifted, family)
        variant.sightings += 1
        small = tiny(trace)
        decision = self._plan(trace, outputs, variant, repeat, family, small, (skeleton, key))
        status = GroupStatus.MISS if first_sighting else STATUS_OF[variant.state]
        self.cache.count(status)
        ran = time.perf_counter()
        with rng_as_recorded(trace):
            values = self._run(trace, outputs, variant)
        if status != GroupStatus.HIT and variant.replay_ms is None:  # op by op: strict's cost
            variant.replay_ms = (time.perf_counter() - ran) * 1000
        hand_out(waiting, written, values, settled=small)
        self.groups += 1
        self._publish_group(
            trace, reason, where, status, variant, key, skeleton, started, why, wait, decision
        )
        self.cache.emit_warnings()

    def _plan(
        self,
        trace: Trace,
        outputs: list,
        variant: Variant,
        repeat: bool,
        family: int | None,
        small: bool,
        keys: tuple,
    ) -> Decision:
        """The plan stage (plan.py) over this group's facts; a compile it asks for starts here.
        ``family`` is None on a hit, which never compiles (nor needs the storm bookkeeping)."""
        facts = GroupFacts(
            state=variant.state,
            sightings=variant.sightings,
            repeat=repeat,
            warming=trace.warming,
            tiny=small,
            storming=family is not None and self.cache.storming(family),
            sync_compile=self.options.sync_compile,
        )
        decision = plan(facts)
        if decision.compiles:
            if self.cache.count_family(family) == STORM_VARIANTS:
                warn_storm(trace, STORM_VARIANTS)
            sync = decision.action is Action.COMPILE_AND_WAIT
            self._schedule(trace, outputs, variant, name=short_hash(*keys), wait=sync)
        return decision

    def _new_variant(
        self, trace: Trace, skeleton: GroupKey, key: tuple, lifted: dict, family: int
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
        if not self.options.compile:
            variant.state, variant.error = VariantState.FAILED, "compilation off"
        self.cache.add(skeleton, key, variant)
        return variant, why

    def _skeleton(self, trace: Trace, outputs: tuple) -> GroupKey:
        """The group's structural key. A trace that followed a known sequence to a known end
        finds it there (its ops are the sequence's, so only inputs and outputs are compared);
        others hash every op, and their sequence becomes known."""
        metas = trace.key_metas()
        end = self.recorder.known.extend(trace)
        found = end.ends.get((metas, outputs)) if end is not None and end.ends is not None else None
        if found is not None:
            return found
        skeleton = GroupKey((tuple([op.key for op in trace.ops]), metas, outputs, trace.device))
        if end is not None:
            end.ends = end.ends if end.ends is not None else {}
            if len(end.ends) < MAX_ENDS:
                end.ends[(metas, outputs)] = skeleton
        return skeleton

    def _run(self, trace: Trace, outputs: list, variant: Variant) -> list[torch.Tensor]:
        if variant.state is VariantState.READY:
            args = list(trace.inputs)
            if variant.lifted:
                scalars = [
                    trace.floats[slot] for slot in sorted(variant.lifted, key=lambda s: variant.lifted[s][0])
                ]
                args.append(torch.tensor(scalars, dtype=torch.float64, device=trace.device))
            try:
                return list(variant.fn(*args))
            except Exception:  # find the culprit op by replaying (below)
                pass
        try:
            return replay(trace.ops, trace.inputs, trace.floats, outputs)
        except ReplayError as failure:
            raise FusedOpError(describe_failure(trace, failure)) from failure.error

    def _schedule(self, trace: Trace, outputs: list, variant: Variant, name: str, wait: bool) -> None:
        slot_places = {s.place: i for i, s in enumerate(trace.float_slots)}
        examples = [t.detach() for t in trace.inputs]
        if variant.lifted:
            examples.append(torch.zeros(len(variant.lifted), dtype=torch.float64, device=trace.device))
        ops, floats, lifted = trace.ops, list(trace.floats), dict(variant.lifted)

        def job():
            graph = build_graph(ops, len(examples) - bool(lifted), floats, lifted, slot_places, outputs)
            variant.code = graph.code
            return inductor_compile(graph, examples)

        self.cache.compile(name, variant, job, wait=wait)

    def _check_versions(self, trace: Trace) -> None:
        for index, (tensor, version) in enumerate(zip(trace.inputs, trace.input_versions, strict=True)):
            if tensor._version != version:
                user = next((op for op in trace.ops if reads_input(op, index)), None)
                where = op_location(user) if user else "a recorded op"
                raise FusedOpError(
                    f"a tensor read by {where} was changed outside tpunb's view before the group ran "
                    "(by another thread, or code that bypasses PyTorch's dispatcher); copy the tensor first"
                )

    # --- records ------------------------------------------------------------------------------

    def _publish_group(
        self, trace, reason, where, status, variant, key, skeleton, started, why, wait, decision: Decision
    ) -> None:
        if self.publish is None:
            return
        counts = Counter(op.key[0] for op in trace.ops)  # by op id: cheaper than names
        histogram = {facts_by_id(i).name.removeprefix("aten."): n for i, n in counts.most_common(5)}
        first, said = trace.ops[0], flush_reason(reason)
        self.publish(
            FusionGroup(
                key=short_hash(skeleton, key),
                ops=len(trace.ops),
                top_ops=histogram,
                input_shapes=[list(m[0]) for m in trace.input_metas[:8]],
                trigger=f"{said} at {where.label}" if where else said,
                source=op_location(first),
                status=status,
                compile_ms=variant.compile_ms
                if status == GroupStatus.MISS and self.options.sync_compile
                else None,
                run_ms=(time.perf_counter() - started) * 1000,
                capture_ms=trace.capture_s * 1000,
                eager_ms=variant.replay_ms,
                lifted=len(variant.lifted),
                miss_reason=why,
                plan=decision.reason,
                wait=wait,
                at=where.label if where else None,
            )
        )

    def _compiled(self, name: str, variant: Variant) -> None:
        if self.publish is not None:
            self.publish(
                CompileDone(
                    key=name,
                    ok=variant.state is VariantState.READY,
                    compile_ms=variant.compile_ms or 0.0,
                    error=variant.error,
                )
            )

    def stats(self) -> dict[str, Any]:
        return {
            **self.cache.snapshot(),
            "groups": self.groups,
            "pending_ops": len(self.trace.ops),
            "ops": dict(self.counts),
        }


#: How a group ran, by its variant's state; all but a hit replay op by op.
STATUS_OF = {
    VariantState.READY: GroupStatus.HIT,
    VariantState.SEEN: GroupStatus.EAGER,
    VariantState.COMPILING: GroupStatus.COMPILING,
    VariantState.FAILED: GroupStatus.EAGER,
}

#: ``.item()``, ``bool()`` and friends reach the engine as this op.
READ_SCALAR = torch.ops.aten._local_scalar_dense.default
#: ``torch.tensor(data)`` reaches the engine as this op, on the tensor made from the data.
LIFT_FRESH = torch.ops.aten.lift_fresh.default


def hand_out(
    waiting: list[DeferredTensor], written: list[DeferredTensor], values: list[torch.Tensor], settled: bool
) -> None:
    """A group's results to the wrappers waiting for them; written inputs are real again. A
    tiny group's results are ``settled`` (settled.py): later groups treat them as plain."""
    for wrapper, value in zip(waiting, values, strict=True):
        wrapper._value, wrapper._pending = as_recorded(wrapper, value), None
        wrapper._from_group = not settled
    for wrapper in written:
        wrapper._pending = None


def abandon(trace: Trace, error: BaseException) -> None:
    """A group that failed decides no values: its pending results carry the error (reading
    one raises it), and inputs it would have written keep what they hold."""
    for ref in trace.touched:
        wrapper = ref()
        if wrapper is None or wrapper._pending is None:
            continue
        if wrapper._pending[0] == "n":
            wrapper._error = error
        wrapper._pending = None


def reads_group_result(op: OpFacts, scan: ArgumentScan) -> bool:
    """A value read (``loss.item()``) of a result an earlier group computed. It needs no flush
    (the value is there), but it is where the user's step ends: flushing the ops recorded
    since keeps each group aligned with a step, so the next step's groups repeat the same
    keys. (An optimizer's ``step.item()`` reads a counter no group made: no flush.)"""
    return op.name == "aten._local_scalar_dense" and any(
        getattr(tensor, "_from_group", False) for tensor in scan.tensors
    )


def _code_and_line(frame: FrameType | None) -> tuple[CodeType | None, int]:
    return (frame.f_code, frame.f_lineno) if frame is not None else (None, 0)
