"""The kernel's tpunb state: the default mode, scoped overrides, and per-cell bookkeeping.

Exactly one runtime mode scope is open at a time. Changing the effective mode closes the
open scope (which flushes or synchronises whatever it deferred) and opens the new one, so
runtimes never see nested scopes and switching modes is always a clean boundary.
Between notebook cells no scope is open: work the kernel does outside cells (comm
messages, widget callbacks) runs as plain PyTorch.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

from tpunb import compiler_noise
from tpunb.advice import (
    COMPILE_COST_COUNTER,
    OVERHEAD_COUNTER,
    CellTimes,
    fused_compile_cost,
    fused_overhead,
    fused_slower,
)
from tpunb.cellcompile import CellCompiler
from tpunb.events import CellRun, EventBus, ModeChange
from tpunb.group_rows import GroupRows
from tpunb.mixed_precision import (
    DEFAULT_PRECISION,
    Precision,
    PrecisionError,
    accepted,
    autocast,
    needs_loss_scaling,
    refusal,
)
from tpunb.modes import Mode, ModeConfig
from tpunb.reserved_calls import reserved_call_advice
from tpunb.runtimes import (
    CPU_FALLBACK,
    MODEL_FLOPS,
    CacheStats,
    ModeUnavailable,
    Runtime,
    RuntimeChoice,
    create_runtime,
)
from tpunb.scoped_setting import ScopedSetting

#: How many fusion-group records ``stats()`` returns (a hot training step makes two: its model
#: call and its optimizer step).
STATS_GROUPS = 100


class Session:
    """Mode state for one kernel (or one script), over one runtime."""

    def __init__(self, runtime: Runtime, choice: RuntimeChoice, bus: EventBus | None = None) -> None:
        self.runtime = runtime
        self.choice = choice
        self.bus = bus if bus is not None else EventBus()
        self.summary_enabled = True
        self._modes: ScopedSetting[ModeConfig] = ScopedSetting(ModeConfig())
        self._precisions: ScopedSetting[Precision] = ScopedSetting(DEFAULT_PRECISION)
        self._scaler: tuple[tuple[str, bool], Any] | None = None
        self._active: tuple[tuple[ModeConfig, Precision], ExitStack] | None = None
        self._cell: _CellWindow | None = None
        self._cell_compiler: CellCompiler | None = None
        self.group_rows = GroupRows()
        self.bus.subscribe(self.group_rows.observe)
        self.cell_times = CellTimes()

    # --- modes ----------------------------------------------------------------------------

    @property
    def default(self) -> ModeConfig:
        return self._modes.default

    @property
    def effective(self) -> ModeConfig:
        return self._modes.effective

    @property
    def available_modes(self) -> list[str]:
        """The modes this runtime runs, in the order users meet them."""
        return [m.value for m in Mode if m in self.runtime.modes]

    def check_supported(self, config: ModeConfig) -> None:
        if config.mode not in self.runtime.modes:
            available = ", ".join(self.available_modes)
            raise ModeUnavailable(
                f"{config.mode.value} mode is not available on the {self.runtime.name} runtime "
                f"yet; available here: {available}"
            )

    # --- precision --------------------------------------------------------------------------

    @property
    def default_precision(self) -> Precision:
        return self._precisions.default

    @property
    def effective_precision(self) -> Precision:
        return self._precisions.effective

    @property
    def available_precisions(self) -> list[str]:
        return accepted(self.runtime.autocast_device, _bf16_supported)

    def check_precision(self, precision: Precision) -> None:
        reason = refusal(precision, self.runtime.autocast_device, _bf16_supported)
        if reason is not None:
            raise PrecisionError(
                f"{precision} is not available on the {self.runtime.name} runtime ({self.runtime.device}): "
                f"{reason}; accepted here: {', '.join(self.available_precisions)}"
            )

    def set_precision(self, precision: Precision) -> None:
        """Make ``precision`` that of this and later cells (or of the rest of a script)."""
        self.check_precision(precision)
        self._precisions.default = precision
        self._activate_now()

    def request_precision(self, precision: Precision, off_thread: bool = False) -> bool:
        """``set_precision`` from outside the running cell (the lab extension's picker), by
        ``request_default``'s rule. Returns whether it applied now."""
        self.check_precision(precision)
        if self.cell_running or off_thread:
            self._precisions.request(precision, "lab")
            return False
        self._precisions.take_pending()
        self.set_precision(precision)
        return True

    @property
    def pending_precision(self) -> Precision | None:
        """A requested precision waiting for the running cell to end."""
        return self._precisions.pending[0] if self._precisions.pending is not None else None

    @contextlib.contextmanager
    def precision_scoped(self, precision: Precision, whole_cell: bool = False) -> Iterator[None]:
        """Run a block in ``precision``; the previous one is back afterwards, even on error.
        ``whole_cell``: the block is the running cell's code (a ``%%tpu_precision`` cell), so
        the cell's summary names this precision alone."""
        self.check_precision(precision)
        with self._precisions.overridden(precision, self._activate):
            if whole_cell and self._cell is not None:
                self._cell.whole_precision = precision
            yield

    def grad_scaler(self) -> Any:
        """The session's loss scaler for the effective precision: one ``torch.amp.GradScaler``
        per device and need, so its scale carries over from step to step and cell to cell;
        enabled only where float16 needs it (needs_loss_scaling)."""
        import torch

        device = self.runtime.autocast_device
        key = (device, needs_loss_scaling(self.effective_precision, device))
        if self._scaler is None or self._scaler[0] != key:
            self._scaler = (key, torch.amp.GradScaler(device, enabled=key[1]))
        return self._scaler[1]

    # --- modes ----------------------------------------------------------------------------

    def set_default(self, config: ModeConfig, source: str = "api") -> None:
        """Make ``config`` the mode of this and later cells (or of the rest of a script)."""
        self.check_supported(config)
        previous, self._modes.default = self._modes.default, config
        self.runtime.default_changed(config)
        self.bus.publish(ModeChange(previous=previous.describe(), current=config.describe(), source=source))
        self._activate_now()

    def _activate_now(self) -> None:
        """A new default applies at once inside a running cell or a script; in a notebook
        between cells, from the next cell on (scopes are open only while a cell runs)."""
        if self._cell is not None or not self._in_notebook:
            self._activate()

    def request_default(self, config: ModeConfig, source: str, off_thread: bool = False) -> bool:
        """``set_default`` from outside the running cell (the lab extension's picker): applied
        now between cells, or kept and applied when the running cell ends, so a cell never
        changes mode halfway because someone clicked. A request from another thread
        (``off_thread``: the picker over the control channel while cells run) is always kept:
        scopes open and close on the notebook thread only, which applies it when its running
        cell ends or its next one begins. Returns whether it applied now."""
        self.check_supported(config)
        if self.cell_running or off_thread:
            self._modes.request(config, source)
            return False
        self._modes.take_pending()
        self.set_default(config, source=source)
        return True

    @property
    def pending_default(self) -> ModeConfig | None:
        """A requested default waiting for the running cell to end."""
        return self._modes.pending[0] if self._modes.pending is not None else None

    @contextlib.contextmanager
    def scoped(self, config: ModeConfig, whole_cell: bool = False) -> Iterator[None]:
        """Run a block in ``config``; the previous mode is back afterwards, even on error.
        ``whole_cell``: the block is the running cell's code (a ``%%tpu_mode`` cell), so the
        cell's summary names this mode alone, not the default the cell opened in as well."""
        self.check_supported(config)
        with self._modes.overridden(config, self._activate):
            if whole_cell and self._cell is not None:
                self._cell.whole_mode = config.mode
            yield

    def _activate(self) -> None:
        """Open the runtime scope for the effective mode and precision, closing the one open now."""
        target = (self.effective, self.effective_precision)
        if self._active is not None and self._active[0] == target:
            return
        self._deactivate()
        stack = ExitStack()
        if target[0].mode in (Mode.FUSED, Mode.COMPILE):
            stack.enter_context(compiler_noise.quiet())
        stack.enter_context(self.runtime.mode_scope(target[0]))
        stack.enter_context(autocast(target[1], self.runtime.autocast_device))
        self._active = (target, stack)
        if self._cell is not None:
            self._cell.modes.add(target[0].mode)
            self._cell.precisions.add(target[1])

    def _deactivate(self) -> None:
        active, self._active = self._active, None
        if active is not None:
            active[1].close()

    # --- cells ----------------------------------------------------------------------------

    #: Set by the IPython hooks: in a notebook, scopes open only while a cell runs.
    _in_notebook = False

    @property
    def cell_running(self) -> bool:
        return self._cell is not None

    def begin_cell(self, number: int | None, source: str | None = None) -> None:
        """A cell starts; ``source`` (its text) lets its time be compared with the same code's
        in other modes."""
        self._in_notebook = True
        self._apply_pending()
        self.runtime.begin_cell()
        self._cell = _CellWindow(
            number,
            source=source,
            peak_resettable=self.runtime.reset_peak_memory(),
            cache_before=self.runtime.cache_stats(),
            groups_before=self.bus.count("group"),
            compiled_before=self.bus.count("compiled"),
            counters_before=self.runtime.counters(),
        )
        self._activate()

    def end_cell(self, error: BaseException | None) -> CellRun | None:
        """Close the cell's scope, wait for its device work and record what it did. Work the
        cell deferred can fail as its scope closes (a fused group's last flush, the device's
        queue): that error is the cell's, recorded and then raised."""
        cell, self._cell = self._cell, None
        closing: Exception | None = None
        try:
            self._deactivate()
            self.runtime.synchronize()
        except Exception as failure:
            closing = failure
        record = self._record(cell, error or closing) if cell is not None else None
        self._apply_pending()
        if closing is not None and error is None:  # a cell that failed already shows its own error
            raise closing
        return record

    def explain_failure(self, error: BaseException, namespace: dict[str, Any], cell: int | None) -> list[str]:
        """What the runtime says about a cell's error, when the device failed, or which library
        called an API TorchTPU reserves (lines to show after the traceback); never raises: a
        cell's error is already being reported."""
        try:
            return reserved_call_advice(error) or self.runtime.after_failure(error, namespace, cell)
        except Exception as failure:  # the device may be too broken to look at
            return [f"could not look at the device after the failure ({type(failure).__name__}: {failure})"]

    def apply_pending_between_cells(self) -> bool:
        """On the notebook thread: requests kept for the end of a cell take effect now if no
        cell is running (one sent over the control channel just after its cell ended would
        otherwise wait for the next cell). Returns whether none was running."""
        if self.cell_running:
            return False
        self._apply_pending()
        return True

    def _apply_pending(self) -> None:
        """Requests kept while a cell ran (or made from another thread) take effect now."""
        if (mode := self._modes.take_pending()) is not None:
            self.set_default(*mode)
        if (precision := self._precisions.take_pending()) is not None:
            self.set_precision(precision[0])

    def _record(self, cell: _CellWindow, error: BaseException | None) -> CellRun:
        memory = self.runtime.memory() if cell.peak_resettable else None
        cache = self.runtime.cache_stats()
        runs = self.bus.count("compiled") - cell.compiled_before
        compiled = self.bus.recent("compiled", runs) if runs else []
        counters = counter_changes(cell.counters_before, self.runtime.counters())
        groups = self.bus.count("group") - cell.groups_before
        mode = cell.whole_mode.value if cell.whole_mode else _summary_mode(cell.modes)
        precision = (
            cell.whole_precision.value if cell.whole_precision else _summary_precision(cell.precisions)
        )
        wall_s = time.perf_counter() - cell.started
        compiled_graphs = sum(r.graphs for r in compiled)
        compiled_here = compiled_graphs > 0 or cache.compiles > cell.cache_before.compiles
        measured = None
        if cell.source is not None and error is None:
            measured = self.cell_times.slower_than_seen(
                cell.source, precision, mode, wall_s, compiled=compiled_here
            )
            self.cell_times.record(cell.source, precision, mode, wall_s, cell.number)
        record = CellRun(
            cell=cell.number,
            mode=mode,
            wall_s=wall_s,
            peak_bytes=memory.peak if memory is not None else None,
            groups=groups,
            cache_hits=cache.hits - cell.cache_before.hits,
            cache_misses=cache.misses - cell.cache_before.misses,
            error=type(error).__name__ if error is not None else None,
            compiled_graphs=compiled_graphs,
            graph_breaks=sum(sum(r.graph_breaks.values()) for r in compiled),
            break_reasons=_first_reasons([reason for r in compiled for reason in r.graph_breaks]),
            recompiles=_first_reasons([reason for r in compiled for reason in r.recompile_reasons]),
            counters=counters,
            precision=precision,
            peak_flops=self.runtime.peak_flops() if counters.get(MODEL_FLOPS) else None,
            compile_waited_s=sum(r.waited_ms for r in compiled) / 1000,
            storm=next((r.storm for r in compiled if r.storm), None),
            slower=measured
            or (fused_slower(self.bus.recent("group", groups), compiled=compiled_here) if groups else None)
            or fused_compile_cost(counters.get(COMPILE_COST_COUNTER, 0.0), wall_s)
            or fused_overhead(counters.get(OVERHEAD_COUNTER, 0.0), wall_s),
        )
        self.bus.publish(record)
        _warn_fallbacks(counters)
        return record

    # --- the stats snapshot ----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """One plain-dict snapshot that the monitor, the lab extension and tests all read: views
        take what they show from here, never from the runtime."""
        memory = self.runtime.memory()
        return {
            "runtime": self.runtime.name,
            "runtime_reason": self.choice.reason,
            "device": self.runtime.device,
            "mode": self.effective.mode.value,
            "default_mode": self.default.mode.value,
            "modes_available": self.available_modes,
            "precision": self.effective_precision.value,
            "default_precision": self.default_precision.value,
            "precisions_available": self.available_precisions,
            "pending_precision": waiting.value if (waiting := self.pending_precision) is not None else None,
            "busy": self.cell_running,
            "pending_default": pending.mode.value if (pending := self.pending_default) is not None else None,
            "memory": asdict(memory) if memory is not None else None,
            "cache": asdict(self.runtime.cache_stats()),
            "compile": self.runtime.cache_details(),
            "groups": [r.as_dict() for r in self.bus.recent("group", STATS_GROUPS)],
            "group_rows": self.group_rows.rows(time.time(), STATS_GROUPS),
            "compiled": [r.as_dict() for r in self.bus.recent("compiled", STATS_GROUPS)],
            "counters": self.runtime.counters(),
            "last_cell": cells[-1].as_dict() if (cells := self.bus.recent("cell", 1)) else None,
            "hidden_warnings": compiler_noise.hidden(),
        }

    def group_graph(self, key: str) -> str | None:
        """The code of a fusion group's compiled graph, for a view that was asked for it."""
        return self.runtime.group_graph(key)

    @property
    def cell_compiler(self) -> CellCompiler:
        """Compile mode's cell runner, over this runtime's compiler (made on first use)."""
        if self._cell_compiler is None:
            self._cell_compiler = CellCompiler(
                self.runtime.compile_cell,
                self.bus.publish,
                self.runtime.compiled_graphs,
                self.runtime.wait_for_background_compiles,
            )
        return self._cell_compiler


def counter_changes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The counters that moved during a cell (or a profiled block), by how much."""
    changed = {name: value - before.get(name, 0) for name, value in after.items()}
    return {name: round(delta, 6) for name, delta in changed.items() if delta}


#: Recompile reasons a cell summary spells out; the rest are counted (all are in ``stats()``).
SUMMARY_REASONS = 2


def _first_reasons(reasons: list[str]) -> str | None:
    shown = "; ".join(reasons[:SUMMARY_REASONS])
    more = len(reasons) - SUMMARY_REASONS
    return f"{shown} (and {more} more)" if more > 0 else shown or None


def _warn_fallbacks(counters: dict[str, float]) -> None:
    """Ops the device had no kernel for ran on the host: each is a round trip, so say which."""
    ops = [
        f"{name.removeprefix(CPU_FALLBACK)} ×{int(count)}"
        for name, count in counters.items()
        if name.startswith(CPU_FALLBACK)
    ]
    if ops:  # no user frame to point at: the counters say what ran, not where
        text = f"ran on the CPU (no device kernel; each is a device-host round trip): {', '.join(ops)}"
        warnings.warn_explicit(text, RuntimeWarning, filename="tpunb", lineno=0)


def _bf16_supported() -> bool:
    """Whether the GPU has bfloat16 units (asked only of CUDA runtimes)."""
    import torch

    return torch.cuda.is_bf16_supported()


def _summary_precision(used: set[Precision]) -> str:
    """The precisions a cell ran in, fp32 left out when a reduced one ran too (as for modes)."""
    reduced = [p.value for p in Precision if p in used and p is not DEFAULT_PRECISION]
    return "+".join(reduced) or DEFAULT_PRECISION.value


def _summary_mode(used: set[Mode]) -> str:
    """The modes a cell ran in, strict left out when others ran too (``debug``, not
    ``debug+strict``, for a ``%%tpu_mode debug`` cell that started in strict)."""
    special = [m.value for m in Mode if m in used and m is not Mode.STRICT]
    return "+".join(special) or Mode.STRICT.value


class _CellWindow:
    """What is known about the running cell."""

    def __init__(
        self,
        number: int | None,
        *,
        source: str | None,
        peak_resettable: bool,
        cache_before: CacheStats,
        groups_before: int,
        compiled_before: int,
        counters_before: dict[str, float],
    ) -> None:
        self.number = number
        self.source = source
        self.peak_resettable = peak_resettable
        self.cache_before = cache_before
        self.groups_before = groups_before
        self.compiled_before = compiled_before
        self.counters_before = counters_before
        self.started = time.perf_counter()
        self.modes: set[Mode] = set()
        self.precisions: set[Precision] = set()
        self.whole_mode: Mode | None = None  # set by a %%tpu_mode cell: its code ran in it alone
        self.whole_precision: Precision | None = None  # likewise for %%tpu_precision


_session: Session | None = None
_session_lock = threading.Lock()


def get_session() -> Session:
    """The process's session, created (and its runtime detected) on first use."""
    global _session
    with _session_lock:
        if _session is None:
            bus = EventBus()
            runtime, choice = create_runtime(publish=bus.publish)
            _session = Session(runtime, choice, bus)
        return _session
