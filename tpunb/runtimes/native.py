"""The native runtime: stock PyTorch on the CPU or a CUDA GPU.

strict is plain eager; debug adds tpunb's per-op checks; fused is tpunb's own defer-and-fuse
engine (``tpunb.fuse``) compiling with Inductor; compile runs each cell as a function under
``torch.compile`` (``tpunb.cellcompile``), so its ops need no scope here.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from tpunb.advice import COMPILE_COST_COUNTER, OVERHEAD_COUNTER
from tpunb.debug import DebugChecks
from tpunb.events import Record
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.groups.disk_cache import current_cache_dir, rebuild_torn_binaries, use_cache_dir
from tpunb.fuse.groups.idle_imports import import_when_idle
from tpunb.modes import Mode, ModeConfig
from tpunb.runtimes.base import CAPTURE_WAITED, CacheDirError, CacheStats, MemoryInfo


def _host_rss() -> int | None:
    """This process's resident set size, from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _host_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _host_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


class NativeRuntime:
    """CPU or CUDA through stock PyTorch."""

    name = "native"
    modes = frozenset(Mode)
    adopts_tensors = True

    def __init__(self, publish: Callable[[Record], None] | None = None) -> None:
        self._cuda = torch.cuda.is_available()
        self.device = f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"
        self.autocast_device = "cuda" if self._cuda else "cpu"
        self.engine = FusionEngine(torch.device(self.device), publish)
        use_cache_dir()

    @contextlib.contextmanager
    def mode_scope(self, config: ModeConfig) -> Iterator[None]:
        if config.mode is not Mode.FUSED:
            self.engine.release(*notebook_objects())  # what fused cells adopted runs plain again
        if config.mode is Mode.DEBUG:
            checks = DebugChecks(
                allow_nan=config.allow_nan,
                allow_inf=config.allow_inf,
                synchronize=torch.cuda.synchronize if self._cuda else None,
            )
            with checks:
                yield
        elif config.mode is Mode.FUSED:
            options = FuseOptions(sync_compile=config.sync_compile, hot_training=config.hot_training)
            with self.engine.scope(options, adopt=notebook_objects()):
                yield
        else:
            yield

    def synchronize(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    def run_pending(self) -> None:
        self.engine.flush("end of profile")

    def memory(self) -> MemoryInfo:
        if self._cuda:
            return MemoryInfo(
                used=torch.cuda.memory_allocated(),
                peak=torch.cuda.max_memory_allocated(),
                limit=torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory,
                label="CUDA memory",
            )
        return MemoryInfo(used=_host_rss(), peak=_host_peak_rss(), limit=_host_total(), label="host RSS")

    def reset_peak_memory(self) -> bool:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()
            return True
        return False

    def peak_flops(self) -> float | None:
        return None  # nothing here compiles a model whole and counts its FLOPs (MODEL_FLOPS)

    def cache_stats(self) -> CacheStats:
        counters = self.engine.cache.counters
        return CacheStats(counters.requests, counters.hits, counters.misses, counters.compiles)

    def cache_details(self) -> dict[str, object]:
        stats = self.engine.stats()
        return {key: stats[key] for key in ("compile_ms", "failures", "graphs", "ops")}

    def compile_function(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        rebuild_torn_binaries()
        return torch.compile(fn, **{"backend": "inductor", **options})

    def compile_cell(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Inductor with ``fallback_random``: random ops (dropout, ``rand``) draw what eager
        PyTorch draws, from the same generator, so a compile-mode cell keeps strict mode's
        losses and random stream. (Inductor's own generator, its default, draws other numbers;
        ``tpunb.compile`` keeps ``torch.compile``'s defaults.)"""
        return self.compile_function(fn, options={"fallback_random": True})

    def compiled_graphs(self) -> None:
        return None  # Inductor compiles under Dynamo, whose counters the cell compiler reads

    def adopt(self, *objects: Any) -> int:
        return self.engine.adopt(*objects)

    def wait_for_background_compiles(self) -> float:
        started = time.perf_counter()
        self.engine.cache.wait_idle()
        return time.perf_counter() - started

    def counters(self) -> dict[str, float]:
        # the fused engine reports through FusionGroup records and cache_stats, and these
        waited = {CAPTURE_WAITED + what: seconds for what, seconds in self.engine.capture_s.items()}
        cost = self.engine.step_clock.compile_cost_s
        return {OVERHEAD_COUNTER: self.engine.overhead_s, COMPILE_COST_COUNTER: cost, **waited}

    def after_failure(
        self, error: BaseException, namespace: Mapping[str, Any], cell: int | None
    ) -> list[str]:
        return []  # its errors say what failed themselves (CUDA's out-of-memory names its figures)

    def begin_cell(self) -> None:
        self.engine.begin_cell()

    def default_changed(self, config: ModeConfig) -> None:
        """Modes here are per-thread scopes opened by the session; choosing fused or compile
        queues their one-time imports for when the kernel is idle, before the next cell."""
        if config.mode in (Mode.FUSED, Mode.COMPILE):
            import_when_idle()

    def cache_dir(self, path: str | None = None) -> str | None:
        """Inductor's on-disk caches (``tpunb.fuse.groups.disk_cache``): any time, any directory."""
        if path is not None:
            try:
                use_cache_dir(path)
            except OSError as error:
                raise CacheDirError(
                    f"cannot use {path!r}: {error.strerror}; accepted: a directory tpunb can create and write"
                ) from None
        current = current_cache_dir()
        return str(current) if current else None

    def group_graph(self, key: str) -> str | None:
        return self.engine.cache.code(key)

    def device_trace(self, directory: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # torch.profiler records CPU and CUDA itself


def notebook_objects() -> tuple[object, ...]:
    """The notebook's modules and optimizers: what a fused cell adopts before it runs, so
    their parameters and state update inside the fused group (no-op outside IPython)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return ()
    kinds = (torch.nn.Module, torch.optim.Optimizer)
    return tuple(v for v in list(shell.user_ns.values()) if isinstance(v, kinds))
