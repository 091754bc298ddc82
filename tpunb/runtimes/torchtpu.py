"""The TorchTPU runtime (``torch_tpu``, device ``"tpu"``), the native backend that replaces
PyTorch/XLA.

TorchTPU has tpunb's modes built in, as ``torch.tpu.EagerMode``: strict is ``DEFER_NEVER``,
debug is ``DEFER_NEVER_AND_LAUNCH_BLOCKING`` (which also turns on TorchTPU's own bounds
checks; tpunb adds its NaN/Inf origin checks), fused is ``DEFER_AND_FUSE``. A cell runs
under ``torch.tpu.set_eager_mode`` (a per-thread stack that restores on error), and the
default follows ``%tpu_mode`` through the global ``torch.tpu.eager_mode`` so threads a cell
starts see it too; in a fused cell each optimizer step ends the deferred graph, and a module
trained again and again runs compiled whole (torchtpu_fused.py). Compile mode
is ``torch.compile`` with TorchTPU's ``"tpu"`` compiler, handed only what it compiles
correctly (torchtpu_compile.py), fused around it.

Every TorchTPU API used here is experimental or private, so each is reached through
``_tpu_api`` or guarded, and a missing one degrades to "unknown", never to a crash.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tpunb import compiler_noise
from tpunb.debug import DebugChecks
from tpunb.events import FusionGroup, GroupStatus, Record
from tpunb.fuse.groups.cache import GraphCache
from tpunb.fuse.groups.disk_cache import user_cache_root
from tpunb.fuse.hot.trained_modules import TrainedModules, global_hooks_warning
from tpunb.modes import Mode, ModeConfig
from tpunb.runtimes.base import (
    CALLS_FLOPS_UNKNOWN,
    CAPTURE_WAITED,
    COMPILED_WHOLE,
    MODEL_FLOPS,
    PARTLY_COMPILED,
    PAST_VERSION_LIMIT,
    STEPS_NOT_COMPILED,
    UNCOMPILED,
    WHILE_COMPILING,
    CacheDirError,
    CacheStats,
    MemoryInfo,
)
from tpunb.runtimes.moved_parameters import keep_parameters_when_moved
from tpunb.runtimes.torchtpu_batchnorm import RunningStatistics
from tpunb.runtimes.torchtpu_compile import DeviceGuardedBackend, OptimizerSteps, compile_cell_scope
from tpunb.runtimes.torchtpu_fused import (
    TPU_COMPILE_COST_S,
    hot_call_settings,
    tpu_training_compiler,
    without_batchnorm,
)
from tpunb.runtimes.torchtpu_recovery import TpuRecovery

#: tpunb mode -> TorchTPU eager mode; compile cells run fused around their compiled graphs
#: (the optimizer's step among them: torchtpu_compile.py).
EAGER_MODES = {
    Mode.DEBUG: "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    Mode.STRICT: "DEFER_NEVER",
    Mode.FUSED: "DEFER_AND_FUSE",
    Mode.COMPILE: "DEFER_AND_FUSE",
}

#: TorchTPU's shared compile cache (a local path or gs://); read once, at the first TPU use.
TIER3_CACHE_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"

#: The artifact TorchTPU emits per fused materialization when ``TORCH_TRACE`` was set.
EAGER_GROUP_ARTIFACT = "torchtpu_eager_aten_graph"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TorchTPU warns once per experimental API; tpunb's own calls should not make users
    read those (their code's calls still warn)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="<TorchTpu/ApiStage/")
        yield


#: PyTorch's warning on reading ``.grad`` of a tensor autograd does not fill in.
NON_LEAF_GRAD_WARNING = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"


def grad_read_is_torchtpus(message: str, filename: str, lineno: int) -> bool:
    """Whether a non-leaf ``.grad`` warning comes from TorchTPU rather than the user's code.
    TorchTPU's copy to the host also copies the source's ``.grad``, reading it, so every
    ``loss.item()`` warned at the user's line; a line that does not say ``.grad`` did not
    read it (the line is where the warning points, in the cell or a library)."""
    return message.startswith(NON_LEAF_GRAD_WARNING) and ".grad" not in linecache.getline(filename, lineno)


def tpu_chip_count() -> int:
    """TorchTPU's own PCI scan: chips this host has, without initialising the runtime."""
    try:
        from torch_tpu._internal.utils import hardware

        return int(hardware.get_tpu_device_count())
    except (ImportError, AttributeError, OSError):
        return 0


def enqueue_what_was_deferred(torch: Any) -> Callable[[], None]:
    """A call that hands the chip what DEFER_AND_FUSE deferred, compiled as one program, without
    waiting for it to run (TorchTPU's ``synchronize(wait=False)``); where TorchTPU has no such
    call, a full synchronize. Waiting cost a GPT-2 step (6 layers, 768 wide, 8 x 512, bf16, the
    model compiled whole) the overlap of the host's next step with the chip's work: 58 ms a step
    against 49 ms without the cut (a v5e)."""
    try:
        from torch_tpu._internal.sync import synchronize
    except ImportError:
        return torch.accelerator.synchronize
    return functools.partial(synchronize, None, wait=False)


@contextlib.contextmanager
def optimizer_steps_end_the_deferred_graph(torch: Any) -> Iterator[None]:
    """In the block, every optimizer step ends the graph DEFER_AND_FUSE deferred: the chip gets it
    to run. TorchTPU does not know where a training step ends, so a loop that reads no value
    between steps grew one deferred graph across them; measured on a v5e (a 2-layer GPT-2, AdamW,
    10 steps, no tpunb): 2.40 s deferred across steps, 0.38 s cut after each step, 0.50 s strict.
    A loop that reads its loss after the step pays nothing more: the read would run it anyway."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    enqueue = enqueue_what_was_deferred(torch)

    def run_what_was_deferred(optimizer: Any, args: Any, kwargs: Any) -> None:
        enqueue()

    handle = register_optimizer_step_post_hook(run_what_was_deferred)
    try:
        yield
    finally:
        handle.remove()


class TorchTpuRuntime:
    """TorchTPU on the host's chips; with no chip, its mode API and counters still work (and
    tensors stay on the CPU, untouched by the TPU modes)."""

    name = "torchtpu"
    modes = frozenset(Mode)
    adopts_tensors = False

    def adopt(self, *objects: Any) -> int:
        return 0  # it fuses the notebook's own tensors

    def __init__(self, publish: Callable[[Record], None] | None = None) -> None:
        import torch
        import torch_tpu  # noqa: F401  (autoloaded by torch on most installs; explicit here)

        self._torch = torch
        self._tpu = torch.tpu
        self._publish = publish or (lambda record: None)
        self.present = tpu_chip_count() > 0
        self.device = "tpu:0" if self.present else "cpu (no TPU present)"
        self.autocast_device = "tpu" if self.present else "cpu"  # without a chip tensors stay on the CPU
        self._group_handler = _attach_group_handler(self._publish)
        compiler_noise.hold_runtime_warnings(grad_read_is_torchtpus)
        self._compiler: DeviceGuardedBackend | None = None  # made at the first compile
        self._optimizer_steps = OptimizerSteps()
        self._trained_modules: TrainedModules | None = None  # made at the first fused cell on a chip
        self._peak_flops: float | None = None  # read once, at the first cell that reports MFU
        self._recovery = TpuRecovery(torch)
        self._keep_compiles_by_default()
        if self.present:  # TorchTPU 0.2.0 leaves BatchNorm's running statistics out (torchtpu_batchnorm.py)
            RunningStatistics("tpu", lambda: self.eager_mode).install()
            keep_parameters_when_moved(torch)  # model.to(DEVICE) untied weights (moved_parameters.py)

    # --- modes ----------------------------------------------------------------------------

    def _eager_mode(self, mode: Mode) -> Any:
        return getattr(self._tpu.EagerMode, EAGER_MODES[mode])

    @property
    def eager_mode(self) -> str:
        """TorchTPU's effective eager mode now, by name (what tests and the doctor read)."""
        with _quiet():
            return self._tpu.eager_mode.name

    @contextlib.contextmanager
    def mode_scope(self, config: ModeConfig) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            with _quiet():
                stack.enter_context(self._tpu.set_eager_mode(self._eager_mode(config.mode)))
            if config.mode is Mode.DEBUG:  # launch-blocking already waits after each op
                checks = DebugChecks(
                    allow_nan=config.allow_nan,
                    allow_inf=config.allow_inf,
                    synchronize=None,
                    deferred=self._deferred,  # a read costs 5 ms here: gather the NaN/Inf checks
                )
                stack.enter_context(checks)
            if config.mode is Mode.COMPILE:
                stack.enter_context(compile_cell_scope(self._optimizer_steps))
            if config.mode is Mode.FUSED and self.present:
                stack.enter_context(optimizer_steps_end_the_deferred_graph(self._torch))
                if config.hot_training:
                    stack.enter_context(self._trained().scope(config.sync_compile))
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):  # the block's own error is the one to show
                    self.synchronize()
                raise
            if config.mode in (Mode.FUSED, Mode.COMPILE):
                self.synchronize()  # deferred errors surface in this cell, not the next

    def after_failure(
        self, error: BaseException, namespace: Mapping[str, Any], cell: int | None
    ) -> list[str]:
        if not self.present:
            return []
        return self._recovery.after_failure(error, namespace, cell, self.memory())

    @contextlib.contextmanager
    def _deferred(self) -> Iterator[None]:
        """Ops in the block are deferred and fused (debug mode's checks, read a few times a step)."""
        with _quiet():
            deferring = self._tpu.set_eager_mode(self._eager_mode(Mode.FUSED))
        with deferring:
            yield

    def _trained(self) -> TrainedModules:
        """The modules fused cells train, compiled by TorchTPU on a worker thread of tpunb's."""
        if self._trained_modules is None:
            compiler_noise.hold_runtime_warnings(global_hooks_warning)
            compiles = GraphCache(on_compiled=lambda name, variant: None)
            self._trained_modules = TrainedModules(
                compiles,
                tpu_training_compiler(),
                hot_call_settings,
                without_batchnorm,
                TPU_COMPILE_COST_S,
                self._publish,
            )
        return self._trained_modules

    def begin_cell(self) -> None:
        pass  # TorchTPU's DEFER_AND_FUSE keeps its own cache of groups, not per cell

    def default_changed(self, config: ModeConfig) -> None:
        with _quiet():
            self._tpu.eager_mode = self._eager_mode(config.mode)

    def synchronize(self) -> None:
        """Materialize everything deferred and wait (only a TPU has anything to wait for)."""
        if self.present:
            self._torch.accelerator.synchronize()
        if self._group_handler is not None:
            _drain_trace_buffer()

    def run_pending(self) -> None:
        self.synchronize()  # on a TPU, materializes what DEFER_AND_FUSE deferred

    # --- memory -----------------------------------------------------------------------------

    def memory(self) -> MemoryInfo | None:
        if not self.present:
            return None
        accelerator = self._torch.accelerator
        return MemoryInfo(
            used=accelerator.memory_allocated(),
            peak=accelerator.max_memory_allocated(),
            limit=self._hbm_limit(),
            label="HBM",
        )

    def _hbm_limit(self) -> int | None:
        """The HBM a program may use, as the runtime's allocator knows it (15.75 GiB on a v5e),
        else TorchTPU's table of chip sizes (16 GiB), else unknown."""
        try:
            _free, limit = self._torch.accelerator.get_memory_info()
            if limit > 0:  # (0, 0) when the allocator has no statistics
                return int(limit)
        except (RuntimeError, AttributeError):
            pass
        try:
            with _quiet():
                return int(self._tpu.get_device_properties().total_memory)
        except (RuntimeError, AttributeError):  # a generation TorchTPU's table does not know
            return None

    def reset_peak_memory(self) -> bool:
        if not self.present:
            return False
        self._torch.accelerator.reset_peak_memory_stats()
        return True

    def peak_flops(self) -> float | None:
        """The chip's bf16 peak, from TorchTPU's table of TPU generations (197 TFLOP/s on a v5e)."""
        if not self.present:
            return None
        if self._peak_flops is None:
            from torch_tpu._internal.utils import hardware

            self._peak_flops = float(hardware.get_bf16_flops_per_device())
        return self._peak_flops

    # --- the compile cache ------------------------------------------------------------------

    def _perf_stats(self) -> Any:
        try:
            return self._tpu._get_cache_stats()
        except (AttributeError, RuntimeError):
            return None

    def cache_stats(self) -> CacheStats:
        stats = self._perf_stats()
        if stats is None:
            return CacheStats()
        requests, hits = stats.num_cache_reqs, stats.num_cache_hits
        return CacheStats(
            requests=requests, hits=hits, misses=requests - hits, compiles=stats.num_compilations
        )

    def _compile_seconds(self, stats: Any) -> float:
        return sum(entry.compilation_duration.total_seconds() for entry in stats.per_entry_stats)

    def cache_details(self) -> dict[str, object]:
        stats = self._perf_stats()
        if stats is None:
            return {}
        return {
            "compile_ms": round(self._compile_seconds(stats) * 1000, 1),
            "graphs": len(stats.per_entry_stats),
            "failures": None,
            "compile_host_peak_bytes": stats.peak_compilation_host_memory_bytes,
        }

    def wait_for_background_compiles(self) -> float:
        """Waits for the trained modules' compiles (the rest compiles on the calling thread)."""
        started = time.perf_counter()
        if self._trained_modules is not None:
            self._trained_modules.cache.wait_idle()
        return time.perf_counter() - started

    def counters(self) -> dict[str, float]:
        uncompiled = {**self._optimizer_steps.counts, **(self._compiler.counts if self._compiler else {})}
        counts = {UNCOMPILED + what: count for what, count in uncompiled.items()}
        if self._trained_modules is not None:
            for prefix, calls in (
                (COMPILED_WHOLE, self._trained_modules.compiled_calls),
                (WHILE_COMPILING, self._trained_modules.calls_while_compiling),
                (PARTLY_COMPILED, self._trained_modules.partly_compiled_calls),
                (PAST_VERSION_LIMIT, self._trained_modules.calls_past_version_limit),
            ):
                counts.update({f"{prefix}call of {name}": count for name, count in calls.items()})
            counts.update({CAPTURE_WAITED + name: s for name, s in self._trained_modules.capture_s.items()})
            counts[MODEL_FLOPS] = self._trained_modules.model_flops
            counts[STEPS_NOT_COMPILED] = self._trained_modules.steps_not_compiled
            counts[CALLS_FLOPS_UNKNOWN] = self._trained_modules.calls_flops_unknown
        stats = self._perf_stats()
        if stats is None:
            return counts
        return {
            "compile cache requests": stats.num_cache_reqs,
            "compile cache hits": stats.num_cache_hits,
            "graphs compiled": stats.num_compilations,
            "compile s": self._compile_seconds(stats),
            **counts,
        }

    def _keep_compiles_by_default(self) -> None:
        """TorchTPU keeps compiled programs across processes only in its tier-3 cache, off until
        a directory is set. Measured on a v5e, a new process's first step of a small GPT-2 took
        0.58 s with a warm cache against 4.9 s without (strict; fused 0.48 s against 5.1 s; a
        compiled module 11.7 s against 20.6 s). So a kernel whose environment names no cache
        keeps them in ``<user cache dir>/tpunb/torchtpu``, set before the TPU's first use. Not
        without a chip: there TorchTPU compiles nothing for a TPU, and with a cache named its
        compiler starts libtpu, which waits for TPU workers that do not exist."""
        if not self.present or os.environ.get(TIER3_CACHE_ENV):
            return
        with contextlib.suppress(OSError, CacheDirError):  # unwritable, or the TPU already in use:
            self.cache_dir(str(user_cache_root() / "torchtpu"))  # no cache, as the doctor then says

    def cache_dir(self, path: str | None = None) -> str | None:
        """TorchTPU's tier-3 cache, which it reads once, when the TPU is first used."""
        current = os.environ.get(TIER3_CACHE_ENV)
        if path is None or path == current:
            return current
        with _quiet():
            initialised = bool(self._tpu.is_initialized()) if hasattr(self._tpu, "is_initialized") else False
        if initialised:
            raise CacheDirError(
                "TorchTPU reads its cache setting when the TPU is first used; restart the kernel "
                "and run %tpu_cache DIR right after %load_ext tpunb"
            )
        chosen = path if path.startswith("gs://") else os.path.abspath(path)
        if not chosen.startswith("gs://"):
            os.makedirs(chosen, exist_ok=True)
        os.environ[TIER3_CACHE_ENV] = chosen
        return chosen

    # --- compiling --------------------------------------------------------------------------

    def compile_function(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``torch.compile`` for the chip: TorchTPU's compiler, given only graphs whose tensors
        are all on the TPU (torchtpu_compile.py); the other functions run as written."""
        if self._compiler is None:
            from torch._dynamo.backends.registry import lookup_backend

            self._compiler = DeviceGuardedBackend(lookup_backend("tpu"), device_type="tpu")
        return self._torch.compile(fn, **{"backend": self._compiler, "dynamic": False, **options})

    def compile_cell(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        return self.compile_function(fn)

    def compiled_graphs(self) -> None:
        return None  # the "tpu" backend compiles under Dynamo, whose counters tpunb reads

    def group_graph(self, key: str) -> str | None:
        return self._group_handler.graphs.get(key) if self._group_handler is not None else None

    def device_trace(self, directory: str) -> contextlib.AbstractContextManager[None]:
        """None: TorchTPU's device tracing plugs into torch.profiler itself (a ``TpuProfilerConfig``,
        torch >= 2.12, a chip); without a chip there is nothing beyond torch.profiler's host
        view and TorchTPU's cache counters."""
        return contextlib.nullcontext()


class EagerGroupHandler(logging.Handler):
    """Turns TorchTPU's per-materialization trace artifacts into fusion-group records.

    TorchTPU emits them through ``torch._logging.trace_structured`` when ``TORCH_TRACE`` was
    set before ``import torch``; a handler on the ``torch.__trace`` logger sees each as a
    record whose ``metadata["artifact"]`` holds the group's kernels, cache hit and reason.
    """

    def __init__(self, publish: Callable[[Record], None]) -> None:
        super().__init__(level=logging.DEBUG)
        self._publish = publish
        self.graphs: dict[str, str] = {}  # group key -> its aten graph (sent on a miss)

    def emit(self, record: logging.LogRecord) -> None:
        artifact = (getattr(record, "metadata", None) or {}).get("artifact")
        if not isinstance(artifact, dict) or artifact.get("name") != EAGER_GROUP_ARTIFACT:
            return
        group = eager_group(artifact)
        payload = getattr(record, "payload", None)
        if payload:
            self.graphs[group.key] = payload
        self._publish(group)


def eager_group(artifact: dict[str, Any]) -> FusionGroup:
    """One TorchTPU materialization batch (``torchtpu_eager/kMm+kAdd``) as a fusion group."""
    kernels = str(artifact.get("op_name", "")).split("/", 1)[-1]
    top_ops: dict[str, int] = {}
    for kernel in filter(None, kernels.split("+")):
        top_ops[kernel] = top_ops.get(kernel, 0) + 1
    if artifact.get("compile_failed"):
        status = GroupStatus.COMPILE_FAILED
    else:
        status = GroupStatus.HIT if artifact.get("cache_hit") else GroupStatus.MISS
    return FusionGroup(
        key=kernels[:48] or "?",
        ops=sum(top_ops.values()),
        top_ops=top_ops,
        input_shapes=[],
        trigger=str(artifact.get("reason", "")),
        source="",
        status=status,
        compile_ms=None,
        run_ms=0.0,
        lifted=0,
    )


def _attach_group_handler(publish: Callable[[Record], None]) -> EagerGroupHandler | None:
    """Listen for fusion groups when TorchTPU records them (``TORCH_TRACE`` set before
    import); otherwise attach nothing, since any handler makes torch build trace payloads."""
    try:
        from torch_tpu._internal.tracing import _tpu_torch_tracing

        enabled = bool(_tpu_torch_tracing._structured_log_enabled())
    except (ImportError, AttributeError):
        enabled = False
    if not enabled:
        return None
    handler = EagerGroupHandler(publish)
    logging.getLogger("torch.__trace").addHandler(handler)
    return handler


def _drain_trace_buffer() -> None:
    """Ask TorchTPU to emit the cell's buffered trace events now, not on its 5 s timer."""
    try:
        from torch_tpu._internal import tracing

        flush = tracing._flush
    except (ImportError, AttributeError):
        return
    flush()
