"""The PyTorch/XLA runtime: torch_xla 2.6–2.9, what Colab and Kaggle TPU images ship.

The modes map onto torch_xla's own switches:
- strict: eager mode, so each op is a cached one-op graph, run asynchronously;
- debug: eager mode, plus a real device barrier after every op (``xm.wait_device_ops``;
  ``torch_xla.sync(wait=True)`` only waits for the enqueue), plus tpunb's NaN/Inf and
  bounds checks naming the user's line;
- fused: lazy tracing; the scope ends with ``torch_xla.sync()`` and a barrier, so each cell
  is one graph, plus one per value read (``.item()``, ``if tensor:``, ``.cpu()``), which
  runs everything pending, not only what the value needs (xla_value_reads.py);
- compile: cells run through ``torch_xla.compile`` (one traced graph, training steps
  included; a value read cuts it as in fused cells), ``tpunb.compile`` through
  ``torch.compile(backend="openxla")``.

torch_xla's counters and metrics are process-global and cumulative; the session reports
their per-cell change. Which graph ran and why is only in torch_xla's debug log, so tpunb
turns it on (into a temporary file) when it imports torch_xla itself.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from tpunb.debug import DebugChecks
from tpunb.events import FusionGroup, GroupStatus, Record
from tpunb.modes import Mode, ModeConfig
from tpunb.runtimes.base import CPU_FALLBACK, CacheDirError, CacheStats, MemoryInfo, RuntimeUnavailable
from tpunb.runtimes.hardware import scan_tpu
from tpunb.runtimes.moved_parameters import keep_parameters_when_moved
from tpunb.runtimes.xla_first_backward import StartBeforeFirstBackward
from tpunb.runtimes.xla_graphs import GraphLog, GraphRun
from tpunb.runtimes.xla_shape_guard import RAISES_SINCE, DotShapeGuard
from tpunb.runtimes.xla_value_reads import THIS_FILE as VALUE_READS_FILE
from tpunb.runtimes.xla_value_reads import SyncAtValueReads
from tpunb.source import is_internal_file, location_of
from tpunb.versions import distribution_version, release, torch_xla_mismatch

#: Set to 0 to keep tpunb from turning on torch_xla's graph log (no per-graph fusion groups).
GRAPH_LOG_ENV = "TPUNB_XLA_GRAPH_LOG"

_THIS_FILE = os.path.abspath(__file__)

#: Host fallbacks every program has (``.item()``); the others mean a missing XLA lowering.
EXPECTED_FALLBACKS = frozenset({"aten::_local_scalar_dense"})


def prepare_graph_log(env: MutableMapping[str, str] = os.environ) -> str | None:
    """Turn torch_xla's graph log on before torch_xla is imported (it reads the settings once);
    returns the log file to read, or None when there is none. A user's own PT_XLA_DEBUG_*
    settings win, and so does a torch_xla imported before tpunb (too late to change them)."""
    level = env.get("PT_XLA_DEBUG_LEVEL")
    if level is not None or "torch_xla" in sys.modules or env.get(GRAPH_LOG_ENV) == "0":
        logged = level is not None and level.strip().isdigit() and int(level) >= 2
        return env.get("PT_XLA_DEBUG_FILE") if logged else None
    handle, path = tempfile.mkstemp(prefix="tpunb-xla-graphs-", suffix=".log")
    os.close(handle)
    atexit.register(_remove, path)
    env["PT_XLA_DEBUG_LEVEL"] = "2"
    env["PT_XLA_DEBUG_FILE"] = path
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def check_importable() -> None:
    """Fail early, in words, on the traps that otherwise hang or crash at import."""
    mismatch = torch_xla_mismatch(distribution_version("torch"), distribution_version("torch_xla"))
    if mismatch:
        raise RuntimeUnavailable(mismatch)
    if "jax" in sys.modules and scan_tpu().present:
        raise RuntimeUnavailable(
            "jax was imported before torch_xla in this process; on a TPU whichever touches the chip "
            "first owns it and torch_xla would hang. Restart the kernel and load tpunb before jax."
        )


class XlaRuntime:
    """PyTorch/XLA on its PJRT device (TPU, or CPU with ``PJRT_DEVICE=CPU``)."""

    name = "xla"
    modes = frozenset(Mode)
    adopts_tensors = False

    def adopt(self, *objects: Any) -> int:
        return 0  # it fuses the notebook's own tensors

    def __init__(self, publish: Callable[[Record], None] | None = None) -> None:
        check_importable()
        log_path = prepare_graph_log()
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as metrics

        self._torch_xla, self._xm, self._metrics = torch_xla, xm, metrics
        self._publish = publish or (lambda record: None)
        # Not torch_xla.device(): that starts the PJRT runtime, after which a notebook can no
        # longer spawn processes (torch_xla.launch / xmp.spawn). Wait for the user's first op.
        self.device = "xla:0"
        self.autocast_device = "xla"
        self._memory_supported = True
        self._cache_dir: str | None = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        self._graph_log = GraphLog(log_path) if log_path else None
        if self._graph_log is not None:
            self._graph_log.skip_to_end()
        self._seen_samples: dict[str, float] = {}
        keep_parameters_when_moved(torch)  # model.to("xla") unties weights (moved_parameters.py)

    # --- modes ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def mode_scope(self, config: ModeConfig) -> Iterator[None]:
        with self._shape_guard(), self._start_before_first_backward(config), self._mode(config):
            yield

    def _start_before_first_backward(self, config: ModeConfig) -> contextlib.AbstractContextManager[Any]:
        """Until the runtime is up, a backward pass starts it first (xla_first_backward.py).
        Not in compile mode, whose cells torch_xla traces as they are."""
        if self.started() or config.mode is Mode.COMPILE:
            return contextlib.nullcontext()
        return StartBeforeFirstBackward(self._torch_xla.device, self.started)

    def _shape_guard(self) -> contextlib.AbstractContextManager[Any]:
        """torch_xla before 2.9 aborts the process on a mismatched matmul (xla_shape_guard)."""
        version = distribution_version("torch_xla")
        if version is not None and release(version)[:2] < RAISES_SINCE:
            return DotShapeGuard()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _mode(self, config: ModeConfig) -> Iterator[None]:
        if config.mode is Mode.STRICT:
            with self._eager(True):
                yield
        elif config.mode is Mode.DEBUG:
            checks = DebugChecks(
                allow_nan=config.allow_nan, allow_inf=config.allow_inf, synchronize=self._xm.wait_device_ops
            )
            with self._eager(True), checks:
                yield
        else:  # fused, and compile (torch_xla.compile of the cell, or lazy tracing like fused)
            with self._eager(False), SyncAtValueReads(self._torch_xla.sync):
                try:
                    yield
                finally:
                    if self.started():
                        self._torch_xla.sync()
                    self.synchronize()

    @contextlib.contextmanager
    def _eager(self, on: bool) -> Iterator[None]:
        from torch_xla.experimental import eager_mode, is_eager_mode

        previous = is_eager_mode()
        if on and not previous and self.started():
            self._torch_xla.sync()  # pending lazy work must not join the first eager op's graph
        eager_mode(on)
        try:
            yield
        finally:
            eager_mode(previous)

    def after_failure(
        self, error: BaseException, namespace: Mapping[str, Any], cell: int | None
    ) -> list[str]:
        return []  # not yet told apart on PyTorch/XLA (no chip of its kind here to learn from)

    def begin_cell(self) -> None:
        pass  # PyTorch/XLA caches graphs by their content, not per cell

    def default_changed(self, config: ModeConfig) -> None:
        pass  # the eager flag is set per cell by mode_scope

    def run_pending(self) -> None:
        from torch_xla.experimental import is_eager_mode

        if self.started() and not is_eager_mode():
            self._torch_xla.sync()

    def started(self) -> bool:
        """Whether the PJRT runtime is up (the user's code has touched the device)."""
        return bool(self._torch_xla._XLAC._xla_runtime_is_initialized())

    def synchronize(self) -> None:
        """A real barrier (``sync(wait=True)`` is not one); then report the graphs that ran."""
        if self.started():
            self._xm.wait_device_ops()
            self._publish_groups()

    # --- counters ---------------------------------------------------------------------------

    def _counter(self, name: str) -> int:
        return self._metrics.counter_value(name) or 0

    def _metric_total(self, name: str) -> float:
        data = self._metrics.metric_data(name)
        return float(data[1]) if data else 0.0

    def wait_for_background_compiles(self) -> float:
        return 0.0  # the runtime's compiler runs on the calling thread

    def counters(self) -> dict[str, float]:
        ns = 1e-9
        values: dict[str, float] = {
            "graphs executed": self._counter("ExecuteComputation") + self._counter("ExecuteReplicated"),
            "graphs compiled": self._counter("UncachedCompile"),
            "compile cache hits": self._counter("CachedCompile"),
            "compile s": (self._metric_total("CompileTime") + self._metric_total("EagerOpCompileTime")) * ns,
            "execute s": (self._metric_total("ExecuteTime") + self._metric_total("EagerOpExecuteTime")) * ns,
            "IR nodes traced": self._metric_total("TensorsGraphSize"),
            "device-to-host transfers": self._count_samples("TransferFromDeviceTime"),
            "persistent cache hits": self._counter("PersistentCacheHit"),
            "persistent cache misses": self._counter("PersistentCacheMiss"),
        }
        for name in self._metrics.counter_names():
            if name.startswith("aten::") and name not in EXPECTED_FALLBACKS:
                values[CPU_FALLBACK + name] = self._counter(name)
        return values

    def _count_samples(self, name: str) -> int:
        data = self._metrics.metric_data(name)
        return int(data[0]) if data else 0

    def cache_stats(self) -> CacheStats:
        hits, misses = self._counter("CachedCompile"), self._counter("UncachedCompile")
        return CacheStats(requests=hits + misses, hits=hits, misses=misses, compiles=misses)

    def cache_details(self) -> dict[str, object]:
        import torch_xla.runtime as xr

        counters = self.counters()
        return {
            "compile_ms": round(counters["compile s"] * 1000, 1),
            "graphs": xr.get_num_cached_compilation_graph() if self.started() else 0,
            "failures": None,
            "persistent_hits": counters["persistent cache hits"],
        }

    def compiled_graphs(self) -> int:
        return self._counter("UncachedCompile")

    # --- memory -----------------------------------------------------------------------------

    def memory(self) -> MemoryInfo | None:
        """HBM from PJRT's allocator stats; None where PJRT has none (the CPU client)."""
        if not self._memory_supported or not self.started():
            return None
        try:
            info = self._xm.get_memory_info(self._torch_xla.device())
        except RuntimeError:  # "GetAllocatorStats is not supported" on CPU
            self._memory_supported = False
            return None
        return MemoryInfo(
            used=info.get("bytes_used"),
            peak=info.get("peak_bytes_used"),
            limit=info.get("bytes_limit"),
            label="HBM",
        )

    def reset_peak_memory(self) -> bool:
        return False  # torch_xla cannot reset its peak (pytorch/xla#8900)

    def peak_flops(self) -> float | None:
        return None  # nothing here compiles a model whole and counts its FLOPs (MODEL_FLOPS)

    # --- compiling --------------------------------------------------------------------------

    def compile_function(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        import torch

        return torch.compile(fn, **{"backend": "openxla", **options})

    def compile_cell(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        return self._torch_xla.compile(fn)

    def group_graph(self, key: str) -> str | None:
        return None  # torch_xla keeps compiled programs, not their text

    @contextlib.contextmanager
    def device_trace(self, directory: str) -> Iterator[str]:
        """torch_xla's profiler (the device's and the runtime's own events, XLA's compiles and
        executions), written as ``DIR/plugins/profile/<time>/``."""
        import torch_xla.debug.profiler as xp

        xp.start_trace(directory)
        try:
            yield directory
        finally:
            xp.stop_trace()

    def cache_dir(self, path: str | None = None) -> str | None:
        """torch_xla's persistent cache, which it only accepts before the first computation."""
        if path is None or os.path.abspath(path) == self._cache_dir:
            return self._cache_dir
        import torch_xla.runtime as xr

        if self._torch_xla._XLAC._xla_computation_cache_is_initialized():
            raise CacheDirError(
                "torch_xla's persistent cache must be set before the first XLA computation; "
                "restart the kernel and run %tpu_cache DIR right after %load_ext tpunb"
            )
        directory = os.path.abspath(path)
        os.makedirs(directory, exist_ok=True)
        xr.initialize_cache(directory, readonly=False)
        self._cache_dir = directory
        return directory

    # --- fusion groups from the graph log --------------------------------------------------

    def _new_samples(self, name: str) -> list[float]:
        """Samples of metric ``name`` recorded since the last call."""
        data = self._metrics.metric_data(name)
        if not data:
            return []
        since = self._seen_samples.get(name, 0.0)
        fresh = [(ts, value) for ts, value in data[2] if ts > since]
        if fresh:
            self._seen_samples[name] = fresh[-1][0]
        return [value for _, value in fresh]

    def _publish_groups(self) -> None:
        if self._graph_log is None:
            return
        runs = self._graph_log.read()
        sizes = self._new_samples("TensorsGraphSize")
        compile_ms = [ns / 1e6 for ns in self._new_samples("CompileTime")]
        run_ms = [ns / 1e6 for ns in self._new_samples("ExecuteTime")]
        sizes = sizes[-len(runs) :] if runs else []
        compiled = sum(run.compiled for run in runs)  # the newest compile samples are theirs
        compiles = iter(compile_ms[len(compile_ms) - compiled :])
        for index, run in enumerate(runs):
            self._publish(
                _fusion_group(
                    run,
                    ops=int(sizes[index]) if index < len(sizes) else 0,
                    compile_ms=next(compiles, None) if run.compiled else None,
                    run_ms=run_ms[index - len(runs)] if len(run_ms) >= len(runs) else 0.0,
                )
            )


def _fusion_group(run: GraphRun, *, ops: int, compile_ms: float | None, run_ms: float) -> FusionGroup:
    """One executed XLA graph as a fusion-group record."""
    user = next(((file, line) for _, file, line in run.frames if not is_internal_file(file)), None)
    where = location_of(*user).label if user else None
    files = {file for _, file, _ in run.frames}
    own_sync = run.cause == "torch_xla.sync()" and _THIS_FILE in files
    read_sync = run.cause == "torch_xla.sync()" and VALUE_READS_FILE in files
    trigger = "cell end" if own_sync else "value read" if read_sync else run.cause
    return FusionGroup(
        key=run.graph_hash[:12],
        ops=ops,
        top_ops={},
        input_shapes=[],
        trigger=f"{trigger} at {where}" if where and not own_sync else trigger,
        source=where or "",
        status=GroupStatus.MISS if run.compiled else GroupStatus.HIT,
        compile_ms=compile_ms,
        run_ms=run_ms,
        lifted=0,
    )
