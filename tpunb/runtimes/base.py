"""The Runtime protocol: the one seam between tpunb's modes and a backend.

Everything above this seam (session, magics, monitor, lab extension) is runtime-agnostic;
a new backend is one module that answers these few questions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

    def __post_init__(self) -> None:
        # A figure below zero or above the device's capacity is a counter that cannot be
        # trusted (TorchTPU under a libtpu it was not built for reported a 127 TiB peak on a
        # 16 GiB chip): it is unknown, never shown.
        for name in ("used", "peak"):
            value = getattr(self, name)
            if value is not None and (value < 0 or (self.limit is not None and value > self.limit)):
                object.__setattr__(self, name, None)
        # Used and peak come from two readings (the host's RSS now and the kernel's high-water
        # mark; a device's live bytes and its counter), which can cross by a page: a peak
        # shown below current use (493.4 MiB used, 493.2 MiB peak) reads as a bug.
        if self.used is not None and self.peak is not None and self.peak < self.used:
            object.__setattr__(self, "peak", self.used)


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
    autocast_device: str  # the device type torch.autocast takes for its tensors: "cpu", "cuda", "xla", "tpu"
    modes: frozenset[Mode]  # the modes this runtime can run today
    # fused cells swap the notebook's tensors for the engine's in place (``adopt``), which
    # torch.profiler's shape recording cannot follow (profiling/torch_trace.py)
    adopts_tensors: bool

    def adopt(self, *objects: Any) -> int:
        """Let modules' parameters and optimizers' state take part in fused groups, in place;
        how many tensors were adopted (0 on runtimes that fuse without it)."""
        ...

    def mode_scope(self, config: ModeConfig) -> AbstractContextManager[None]:
        """Make the ops issued inside the block run in ``config``'s mode."""
        ...

    def synchronize(self) -> None:
        """Wait for queued device work, so errors and timings land in the right cell."""
        ...

    def run_pending(self) -> None:
        """Run what the current mode has deferred (the fused group recorded so far, the lazy
        graph traced so far) now, as the end of its scope would, staying in the scope: the
        end of a profiled block, whose last group must run while the profiler watches."""
        ...

    def memory(self) -> MemoryInfo | None:
        """Current/peak/limit memory, or None when the runtime cannot tell."""
        ...

    def reset_peak_memory(self) -> bool:
        """Start a new peak window; False when peaks cannot be reset (per-cell peak unknown)."""
        ...

    def peak_flops(self) -> float | None:
        """The device's peak FLOP/s for the figures the summary's MFU is quoted against (a
        TPU's bf16 peak), or None where the runtime does not know it."""
        ...

    def cache_stats(self) -> CacheStats:
        """The compile-cache counters."""
        ...

    def cache_details(self) -> dict[str, object]:
        """Extra cache figures for the monitor (compile time, failures, graphs); {} if none."""
        ...

    def compile_function(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``tpunb.compile``'s compiler for this runtime (``torch.compile`` with its backend);
        ``options`` are ``torch.compile``'s keyword arguments."""
        ...

    def compile_cell(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Compile mode's compiler for a cell made into a zero-argument function."""
        ...

    def compiled_graphs(self) -> int | None:
        """Graphs this runtime has compiled for compile mode so far, where Dynamo's counters
        do not see them (``torch_xla.compile`` traces without Dynamo); None: count Dynamo's."""
        ...

    def wait_for_background_compiles(self) -> float:
        """Block until the compiles tpunb started off the notebook thread (fused groups) have
        finished; return the seconds waited (0 where nothing compiles in the background)."""
        ...

    def counters(self) -> dict[str, float]:
        """Cumulative runtime counters (graphs executed, compile time, ...); the session
        reports their per-cell change. Keys starting with ``CPU_FALLBACK`` name ops that ran
        on the host because the device has no kernel for them."""
        ...

    def after_failure(
        self, error: BaseException, namespace: Mapping[str, Any], cell: int | None
    ) -> list[str]:
        """A cell raised ``error``: if the device failed (out of memory, a value lost with a
        failed computation), restore what the runtime can and say, in lines for the user, what
        happened, what is lost and what brings it back; [] for the user's own errors."""
        ...

    def begin_cell(self) -> None:
        """A notebook cell starts: a runtime that plans per cell counts it (the native engine
        compiles a cell's set-up only once its runs have paid for it: fuse/groups/plan.py)."""
        ...

    def default_changed(self, config: ModeConfig) -> None:
        """The notebook's default mode is now ``config``: a runtime with a process-wide mode
        setting follows it, so threads a cell starts run in the default mode too."""
        ...

    def cache_dir(self, path: str | None = None) -> str | None:
        """The persistent compile-cache directory; with ``path``, set it first (CacheDirError
        when the runtime no longer accepts a change)."""
        ...

    def group_graph(self, key: str) -> str | None:
        """The graph (FX code, StableHLO, HLO) of the fusion group ``key``, where kept."""
        ...

    def device_trace(self, directory: str) -> AbstractContextManager[str | None]:
        """The runtime's own profiler over a block (``%%tpu_profile``), beside torch.profiler:
        yields the trace directory it writes (TensorBoard's profile plugin and xprof open it),
        or None where torch.profiler sees all there is (the native runtime)."""
        ...


#: Prefix of ``Runtime.counters`` keys that count host fallbacks of one op.
CPU_FALLBACK = "cpu fallback: "
#: Prefix of ``Runtime.counters`` keys that count what compile cells ran uncompiled, by a noun
#: phrase whose first word takes the plural ("step of AdamW": "6 steps of AdamW").
UNCOMPILED = "ran uncompiled: "
#: Prefixes of ``Runtime.counters`` keys that count a fused cell's calls of a model compiled
#: whole by the runtime's compiler ("call of GPT2LMHeadModel"): run compiled, run otherwise
#: (as captured, or as its own call) while its compile was under way, run with one of its
#: graphs as captured because that graph's compile failed, and run uncompiled by Dynamo, past
#: its limit of compiled versions (fuse/hot/trained_modules.py, ``_make_hot``).
COMPILED_WHOLE = "compiled whole: "
WHILE_COMPILING = "ran uncompiled while compiling: "
PARTLY_COMPILED = "ran partly compiled (a compile failed): "
PAST_VERSION_LIMIT = "ran uncompiled (past Dynamo's limit of compiled versions): "
#: Prefix of ``Runtime.counters`` keys: the seconds a fused cell's calls of a model waited while
#: Dynamo captured it on the notebook's thread, by model class ("GPT2LMHeadModel").
CAPTURE_WAITED = "waited while Dynamo captured: "
#: ``Runtime.counters`` key: the FLOPs those compiled calls ran, forward and backward.
MODEL_FLOPS = "model FLOPs compiled whole"
#: ``Runtime.counters`` key: training steps of such models that ran before they were compiled
#: (under the runtime's own fusion), whose FLOPs are not counted: a cell with any gives no MFU.
STEPS_NOT_COMPILED = "model steps not compiled"
#: ``Runtime.counters`` key: compiled calls of such models with a graph whose FLOPs could not be
#: counted (flops.py): a cell with any gives no MFU either (it would be too low).
CALLS_FLOPS_UNKNOWN = "model calls with FLOPs not counted"


class CacheDirError(ValueError):
    """The persistent compile cache cannot be set (now, or to that directory)."""


class ModeUnavailable(ModeError):
    """The runtime cannot run the requested mode (yet)."""


class RuntimeUnavailable(RuntimeError):
    """A runtime was asked for that cannot be used here."""
