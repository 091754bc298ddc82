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

``flush`` hands the trace to the flush stage (flush.py): key it (from the end of its known
sequence when it followed one), plan it (plan.py: run compiled, replay, or replay and compile
for next time, on the worker: cache.py, worker.py), run it, hand the results to the waiting
wrappers, and publish a FusionGroup record.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tpunb.events import CompileDone
from tpunb.fuse.aside import ModeStack, outside_modes
from tpunb.fuse.errors import check_not_failed
from tpunb.fuse.groups.cache import GraphCache, Variant
from tpunb.fuse.groups.compilers import INDUCTOR, GraphCompiler
from tpunb.fuse.groups.flush import FlushRequest, GroupFlush, abandon
from tpunb.fuse.hot.compile_later import donated_buffers_off
from tpunb.fuse.hot.hotcalls import HotCalls, left_to_adopt
from tpunb.fuse.hot.hotsteps import HotSteps
from tpunb.fuse.hot.step_clock import StepClock
from tpunb.fuse.interrupts import InterruptGuard
from tpunb.fuse.options import FuseOptions
from tpunb.fuse.recording.adopt import Adoption
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.recording.eager import EagerOps
from tpunb.fuse.recording.growing import GrowingInputs
from tpunb.fuse.recording.meta import MetaCache, NotDeferrable
from tpunb.fuse.recording.ops import OpFacts, facts
from tpunb.fuse.recording.record import NOT_FOLLOWED, Recorder
from tpunb.fuse.recording.scan import ArgumentScan, all_scalar, run_on_values
from tpunb.fuse.recording.settled import NO_TENSORS, PLAIN, mark, settled_arguments, settled_read, small
from tpunb.fuse.recording.trace import Trace
from tpunb.fuse.recording.wrapper_meta import STORAGE_CHANGING
from tpunb.fuse.workarounds import once_logging_out_of_graphs, skip_dynamo_in
from tpunb.source import locate, user_frame


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
    def __init__(self, device: torch.device, publish: Any = None, compiler: GraphCompiler = INDUCTOR) -> None:
        self.device = torch.device(device)
        # where group records go; None: none is built (a benchmark timing the engine alone)
        self.publish = publish
        self.compiler = compiler  # what compiles groups, hot calls and steps (compilers.py)
        self.trace = Trace()
        self.meta = MetaCache()
        self.cache = GraphCache(self._compiled)
        self.options = FuseOptions()
        self.groups = 0
        #: the engine's own time around the calls and optimizer steps it ran as strict mode runs
        #: them (hot ones waiting for their compile to pay off): what fused added to such a
        #: loop, which the summary line reports where it is noticeable (advice.py)
        self.overhead_s = 0.0
        #: seconds the notebook's thread waited while Dynamo captured a hot call or step (and
        #: Inductor compiled a no-grad call in it), unasked (not ``--sync-compile``), by what
        #: was captured: the summary line says so (report.py's ``capture_wait_part``)
        self.capture_s: collections.Counter[str] = collections.Counter()
        #: what compiles cost the steps of the cells that captured (step_clock.py)
        self.step_clock = StepClock()
        # ops, by how they ran: recorded the new way, followed a known sequence, run eagerly
        self.counts = {"recorded": 0, "followed": 0, "eager": 0, "bookkeeping": 0}
        self.recorder = Recorder(self, self.flush)
        self.growing = GrowingInputs()
        self.flusher = GroupFlush(self.cache, self.recorder.known, self.growing, compiler.compile_graph)
        self.eager = EagerOps(
            self.device, self.counts, self.flush, lambda value: DeferredTensor.wrap(value, self)
        )
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
                self.adopt(*left_to_adopt(adopt))
                with (
                    self.adoption.active(),
                    self.hot.hooks.installed(),
                    donated_buffers_off(),
                    once_logging_out_of_graphs(),
                    self.modes.entered(FuseMode(self)),
                ):
                    yield
            finally:
                try:
                    self.flush("end of fused block")
                finally:
                    self.options = previous

    def begin_cell(self) -> None:
        """A notebook cell starts: a group seen again only in a later cell is a cell's set-up,
        not a loop's step, and compiles once its runs have paid for it (plan.py). Without
        cells (a script's scopes, the engine driven alone) every group is counted as a loop's."""
        self.flusher.in_this_cell.clear()
        self.step_clock.begin_cell()

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
        if op.tensorless:
            # the profiler markers of every optimizer's zero_grad and step: nothing to record,
            # and the recorder's and scan's bookkeeping for them cost 35 us a step (measured)
            return func(*args, **kwargs)
        if op.may_settle and (settled := settled_arguments(args, kwargs, self.trace.dirty_storages)):
            # a loop's small bookkeeping around its model, and factories, run at once
            # (settled.py): nothing is recorded, so no interrupt needs holding
            if settled == NO_TENSORS:
                out = func(*args, **kwargs)
                if not small(out):
                    self.counts["eager"] += 1
                    return self.eager.wrap_new(out, args, kwargs)
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
        if func is READ_SCALAR and (value := settled_read(args[0], self.trace.dirty_storages)) is not None:
            self.counts["bookkeeping"] += 1
            return func(value)
        result = self.recorder.follow(func, args, kwargs)
        if result is not NOT_FOLLOWED:
            return result
        scan = ArgumentScan()
        masked = op.floats_keep_metadata
        signature = (op.id, scan.signature(args, masked), scan.signature(kwargs, masked))
        if not scan.tensors and not op.returns_tensor:
            return func(*args, **kwargs)  # its optional tensors left out
        if scan.unsupported or op.boundary or op.name in STORAGE_CHANGING:
            return self.eager.run(self.trace, func, op, args, kwargs, scan)
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
            return self.eager.run(self.trace, func, op, args, kwargs, scan, bookkeeping=True)
        if outputs is NotDeferrable:
            return self.eager.run(self.trace, func, op, args, kwargs, scan)
        device = self._device_of(args, kwargs, scan)
        if device is None or scan.writes_real(op, args, kwargs):
            return self.eager.run(self.trace, func, op, args, kwargs, scan)
        where = _code_and_line(user_frame(sys._getframe()))
        if self.growing.covers(func, *where):
            # its input grows every step (growing.py): run it now, flushing only if it must;
            # its results stay plain, so a group reads them as copies if small (trace.py)
            return mark(
                self.eager.run(self.trace, func, op, args, kwargs, scan, bookkeeping=True, wrap=False)
            )
        return self.recorder.record(func, op, args, kwargs, outputs, device, where)

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

    # --- materialization ----------------------------------------------------------------------

    def materialize(self, wrapper: DeferredTensor, reason: str) -> torch.Tensor:
        check_not_failed(wrapper)
        if wrapper.pending is not None or (
            wrapper.value is not None
            and self.trace.dirty_storages
            and wrapper.value.untyped_storage().data_ptr() in self.trace.dirty_storages
        ):
            self.flush(reason, wait=True)
        check_not_failed(wrapper)
        return wrapper.value

    def flush(self, reason: str, wait: bool = False, warming: bool = False) -> None:
        """Run everything recorded so far as one group; ``wait``: because the host needs
        values now (a read, an op that cannot be deferred), not at a boundary of the engine's;
        ``warming``: before a call compiled whole, after which the trace will not come back
        (hotcalls.py), so it is not compiled."""
        __tracebackhide__ = True
        self.trace.warming |= warming
        if not self.trace.ops:
            return
        # the group's own ops are not recorded; an interrupt waits until its results are handed
        # out; autocast already chose each recorded op's dtypes, so it must not cast them again
        # (a flush from Python code, not from inside an op: an optimizer hook, a hot call)
        with self.interrupts, outside_modes(), torch.no_grad(), torch._C._DisableAutocast():
            trace, self.trace = self.trace, Trace(warming=self.hot.warming)
            request = FlushRequest(reason, locate(sys._getframe(1)), wait)
            try:
                self.flusher.run(trace, request, self.options, self.publish)
            except BaseException as error:  # failed: its results are lost, inputs stay real
                abandon(trace, error)
                raise
            self.groups += 1

    def _compiled(self, name: str, variant: Variant) -> None:
        done = variant.done  # (published before the cache calls this)
        if self.publish is not None and done is not None:
            ok = done.fn is not None
            self.publish(CompileDone(key=name, ok=ok, compile_ms=done.compile_ms, error=done.error))

    def mark_warming(self) -> None:
        """What is recorded from now on until the next flush belongs to a call of a module
        that will be compiled whole: its group will not come back (plan.py), and is not compiled."""
        self.trace.warming = True

    def stats(self) -> dict[str, Any]:
        """Also read by the monitor's sampler thread: one read of the counters' dict (fixed
        keys, copied in C) and one of the current trace's length, each atomic under the GIL."""
        return {
            **self.cache.snapshot(),
            "groups": self.groups,
            "pending_ops": len(self.trace.ops),
            "ops": dict(self.counts),
        }


#: ``.item()``, ``bool()`` and friends reach the engine as this op.
READ_SCALAR = torch.ops.aten._local_scalar_dense.default
#: ``torch.tensor(data)`` reaches the engine as this op, on the tensor made from the data.
LIFT_FRESH = torch.ops.aten.lift_fresh.default


def _code_and_line(frame: FrameType | None) -> tuple[CodeType | None, int]:
    return (frame.f_code, frame.f_lineno) if frame is not None else (None, 0)
