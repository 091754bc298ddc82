"""The native runtime: stock PyTorch on the CPU or a CUDA GPU.

strict is plain eager; debug adds tpunb's per-op checks. fused and compile join the
``modes`` set when their engines land; until then the session refuses them by name.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterator

import torch

from tpunb.debug import DebugChecks
from tpunb.modes import Mode, ModeConfig
from tpunb.runtime.base import CacheStats, MemoryInfo


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
    modes = frozenset({Mode.DEBUG, Mode.STRICT})

    def __init__(self) -> None:
        self._cuda = torch.cuda.is_available()
        self.device = f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"

    @contextlib.contextmanager
    def mode_scope(self, config: ModeConfig) -> Iterator[None]:
        if config.mode is Mode.DEBUG:
            checks = DebugChecks(
                allow_nan=config.allow_nan,
                allow_inf=config.allow_inf,
                synchronize=torch.cuda.synchronize if self._cuda else None,
            )
            with checks:
                yield
        else:
            yield

    def synchronize(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

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

    def cache_stats(self) -> CacheStats:
        return CacheStats()
