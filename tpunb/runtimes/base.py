"""The Runtime protocol: the one seam between tpunb's modes and a backend.

Everything above this seam (session, magics, monitor, lab extension) is runtime-agnostic;
a new backend is one module that answers these few questions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from tpunb.modes import Mode, ModeConfig, ModeError


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes; a figure the runtime cannot know is None, never 0."""

    used: int | None
    peak: int | None
    limit: int | None
    label: str  # what the numbers measure: "HBM", "CUDA memory", "host RSS"


@dataclass(frozen=True)
class CacheStats:
    """Compile-cache counters since the runtime started."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    compiles: int = 0


class Runtime(Protocol):
    """What every backend answers. Implementations live beside this file."""

    # Constructed as ``Runtime(publish)``: ``publish(record)`` sends FusionGroup and other
    # records to the event bus.
    name: str  # "native", "xla", "torchtpu"
    device: str  # "cpu", "cuda:0", "xla:0", "tpu:0"
    modes: frozenset[Mode]  # the modes this runtime can run today

    def mode_scope(self, config: ModeConfig) -> AbstractContextManager[None]:
        """Make the ops issued inside the block run in ``config``'s mode."""
        ...

    def synchronize(self) -> None:
        """Wait for queued device work, so errors and timings land in the right cell."""
        ...

    def memory(self) -> MemoryInfo | None:
        """Current/peak/limit memory, or None when the runtime cannot tell."""
        ...

    def reset_peak_memory(self) -> bool:
        """Start a new peak window; False when peaks cannot be reset (per-cell peak unknown)."""
        ...

    def cache_stats(self) -> CacheStats:
        """The compile-cache counters."""
        ...

    def cache_details(self) -> dict[str, object]:
        """Extra cache figures for the monitor (compile time, failures, graphs); {} if none."""
        ...

    def compile_function(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """Compile mode's compiler for this runtime (``torch.compile`` with its backend);
        ``options`` are ``torch.compile``'s keyword arguments."""
        ...

    def group_graph(self, key: str) -> str | None:
        """The graph (FX code, StableHLO, HLO) of the fusion group ``key``, where kept."""
        ...


class ModeUnavailable(ModeError):
    """The runtime cannot run the requested mode (yet)."""


class RuntimeUnavailable(RuntimeError):
    """A runtime was asked for that cannot be used here."""
