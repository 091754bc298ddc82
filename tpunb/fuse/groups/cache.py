"""Compiled groups, keyed by structure; compiled in the background; counted.

A group's *skeleton* key is its ops (floats masked as slots), argument wiring, input
metadata (shape, stride, offset, dtype, storage alias class), outputs and device. Under a
skeleton, *variants* differ only in the float values baked in. A float is specialised
(baked in) until the same skeleton comes back with a different value there; from then on
that slot is lifted into an input, so a schedule or a bias correction costs one extra
compile, not one per step.

A group compiles on its *second* sighting (unless plan.py says it never pays: tiny,
warming, storming, once a cell): the first runs by replay, and a group seen once
(a setup cell, an evaluation) never costs a compile; by the second, a float that varies per
step (Adam's bias corrections) has shown it varies, so it is lifted before the only compile
rather than after a wasted one. Compiles never block a cell unless asked (``sync_compile``:
compile on the first sighting, and wait): a single worker thread compiles while the group
keeps replaying. A failed compile is remembered and that variant replays from then on.
"""

from __future__ import annotations

import contextvars
import enum
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from tpunb.events import GroupStatus
from tpunb.fuse import config
from tpunb.fuse.groups.worker import CompileWorker

LIFTED = "<lifted>"  # stands for a lifted slot's value in a variant key (floats never equal it)


class VariantState(enum.Enum):
    SEEN = "seen"  # not compiled yet: replays op by op
    COMPILING = "compiling"  # on the worker; replays meanwhile
    READY = "ready"  # compiled: runs the compiled graph
    FAILED = "failed"  # the compile failed (or compiling is off): replays from now on


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compile's outcome. The worker publishes it in one assignment (``Variant.done``) while
    the notebook thread reads, so a reader sees all of it or none of it, never code without
    its state or a state without its code."""

    fn: Callable[..., list[torch.Tensor]] | None  # None: it failed, or compiling is off
    error: str | None = None
    compile_ms: float = 0.0
    code: str | None = None  # the compiled FX graph's Python code, for the monitor


#: The outcome of a variant that will never compile: compiling is off.
NOT_COMPILED = Compiled(fn=None, error="compilation off")


@dataclass
class Variant:
    """One compiled (or compiling, or failed) graph for a skeleton and float values."""

    lifted: dict[int, tuple[int, torch.dtype]]  # float slot -> (index in scalars, dtype)
    sightings: int = 0
    queued: bool = False  # handed to the compiler (the notebook thread's write)
    done: Compiled | None = None  # what the compile gave (the compiler's one write)
    future: Future | None = None  # the queued compile (cancelled when superseded)
    replay_ms: float | None = None  # its ops run one by one (a first sighting): strict's cost
    replayed_ms: float = 0.0  # every sighting's op-by-op runs together: what not compiling cost
    recurs: bool = False  # its structure sighted twice in one cell: a loop's step, not set-up

    @property
    def state(self) -> VariantState:
        done = self.done
        if done is not None:
            return VariantState.READY if done.fn is not None else VariantState.FAILED
        return VariantState.COMPILING if self.queued else VariantState.SEEN


@dataclass
class Skeleton:
    lifted: frozenset[int] = frozenset()
    last_values: tuple | None = None
    variants: dict[tuple, Variant] = field(default_factory=dict)


@dataclass
class CacheCounters:
    requests: int = 0
    hits: int = 0
    misses: int = 0
    compiles: int = 0
    failures: int = 0
    compile_ms: float = 0.0


#: A compile: the compiled function, and the code of the graph it compiled (None if none).
CompileJob = Callable[[], tuple[Callable[..., list[torch.Tensor]], str | None]]
CompileDone = Callable[[str, Variant], None]


class GraphCache:
    def __init__(self, on_compiled: CompileDone) -> None:
        self._skeletons: dict[tuple, Skeleton] = {}
        self._lock = threading.Lock()
        self._worker = CompileWorker()
        self._on_compiled = on_compiled
        self._warnings: list[str] = []
        # weakly: a hot call's or hot step's variant lives as long as its Dynamo cache entry,
        # and its compiled code holds what its graph held (an optimizer's parameters and state)
        self._named: weakref.WeakValueDictionary[str, Variant] = weakref.WeakValueDictionary()
        self._families: dict[int, int] = {}
        self._last_of_family: dict[int, GroupKey] = {}
        self.counters = CacheCounters()

    def variant(
        self, skeleton_key: tuple, floats: list[float], lift_dtypes: list[torch.dtype | None]
    ) -> tuple[Variant | None, tuple, dict[int, tuple[int, torch.dtype]], bool]:
        """The variant for these float values (None on a miss), its key, its lifted slots, and
        whether this skeleton was seen before (with other floats, if the variant is new).

        ``lift_dtypes[i]`` is the dtype slot i computes in, or None when it cannot be lifted.
        """
        values = tuple(floats)
        with self._lock:
            repeat = skeleton_key in self._skeletons
            skeleton = self._skeletons.setdefault(skeleton_key, Skeleton())
            if skeleton.last_values is not None and skeleton.last_values != values:
                varying = {
                    i
                    for i, (old, new) in enumerate(zip(skeleton.last_values, values, strict=True))
                    if old != new and lift_dtypes[i] is not None
                }
                if not varying <= skeleton.lifted:
                    skeleton.lifted = skeleton.lifted | varying
                    self._drop_superseded(skeleton)
            skeleton.last_values = values
            lifted = {slot: (n, lift_dtypes[slot]) for n, slot in enumerate(sorted(skeleton.lifted))}
            key = tuple(LIFTED if i in skeleton.lifted else v for i, v in enumerate(values))
            self.counters.requests += 1
            return skeleton.variants.get(key), key, lifted, repeat

    def _drop_superseded(self, skeleton: Skeleton) -> None:
        """Variants that bake in a float now lifted will not be asked for again: drop those
        not compiled yet, cancelling queued compiles (a compile costs seconds of the worker's time)."""
        for key, variant in list(skeleton.variants.items()):
            if variant.state is VariantState.SEEN or (variant.future is not None and variant.future.cancel()):
                del skeleton.variants[key]

    def add(self, skeleton_key: tuple, key: tuple, variant: Variant) -> None:
        with self._lock:
            self._skeletons[skeleton_key].variants[key] = variant

    def storming(self, family: int) -> bool:
        """Whether a sequence of ops (``family``: a hash of the ops alone) already has
        ``STORM_VARIANTS`` compiled graphs: then its new shapes replay instead of compiling."""
        with self._lock:
            return self._families.get(family, 0) >= config.STORM_VARIANTS

    def count_family(self, family: int) -> int:
        with self._lock:
            self._families[family] = self._families.get(family, 0) + 1
            return self._families[family]

    def previous_of_family(self, family: int, skeleton: GroupKey) -> GroupKey | None:
        """The last other skeleton that missed with the same op sequence (to explain this
        miss); records ``skeleton`` as the newest."""
        with self._lock:
            previous = self._last_of_family.get(family)
            self._last_of_family[family] = skeleton
        return previous if previous != skeleton else None

    def compile(self, name: str, variant: Variant, job: CompileJob, wait: bool) -> None:
        """Run ``job`` (build + compile) on the worker thread; with ``wait``, block for it.

        In the caller's context: torch's config values (Dynamo's, AOTAutograd's, Inductor's) are
        context variables, so a thread sees only their defaults, not what the notebook set
        (TorchTPU sets ``trace_autograd_ops`` at import; a user, Inductor's options)."""
        self._named[name] = variant
        variant.queued = True
        context = contextvars.copy_context()
        variant.future = self._worker.submit(lambda: context.run(self._run_job, name, variant, job), wait)

    def quiet_since(self, started: float) -> bool:
        """Whether the worker has compiled nothing since ``started`` (``CompileWorker.quiet_since``)."""
        return self._worker.quiet_since(started)

    def compile_here(self, name: str, variant: Variant, job: CompileJob) -> None:
        """Run ``job`` on the calling thread: for a compile that must finish before the call
        returns and is already inside Dynamo's compile (which holds the lock the worker takes)."""
        self._named[name] = variant
        variant.queued = True
        self._run_job(name, variant, job)

    def _run_job(self, name: str, variant: Variant, job: CompileJob) -> None:
        started = time.perf_counter()
        try:
            fn, code = job()
        except Exception as error:  # any compiler failure: replay this variant from now on
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            done = Compiled(fn=None, error=reason, compile_ms=(time.perf_counter() - started) * 1000)
            warning = f"tpunb fused: compiling group {name} failed ({reason}); it runs op by op"
        else:
            done = Compiled(fn=fn, compile_ms=(time.perf_counter() - started) * 1000, code=code)
            warning = None
        variant.done = done
        with self._lock:
            self.counters.compile_ms += done.compile_ms
            if warning is None:
                self.counters.compiles += 1
            else:
                self.counters.failures += 1
                self._warnings.append(warning)
        self._on_compiled(name, variant)

    def count(self, status: GroupStatus) -> None:
        with self._lock:
            if status == GroupStatus.HIT:
                self.counters.hits += 1
            elif status == GroupStatus.MISS:
                self.counters.misses += 1

    def emit_warnings(self) -> None:
        """Warn on the caller's thread (compiles fail on the worker), once per failure."""
        with self._lock:
            pending, self._warnings = self._warnings, []
        for message in pending:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def code(self, name: str) -> str | None:
        """The FX code of the group named ``name`` (the FusionGroup record's key), if compiled."""
        variant = self._named.get(name)
        done = variant.done if variant is not None else None
        return done.code if done is not None else None

    def count_whole_call(self, graphs: int, compile_ms: float, uncompiled: bool, compiling: bool) -> None:
        """A hot module call (hotcalls.py): a miss that compiled ``graphs`` graphs, a miss that
        ran uncompiled (Dynamo past its recompile limit), a hit, or neither while its graph
        runs as captured until its compile is done (``compiling``, as a recorded group that
        replays while it compiles: its row says compiling, and the hits do not climb)."""
        with self._lock:
            c = self.counters
            c.requests += 1
            if graphs or uncompiled:
                c.misses += 1
                c.compiles += graphs
                c.compile_ms += compile_ms
            elif not compiling:
                c.hits += 1

    def wait_idle(self) -> None:
        """Block until queued compiles finish (tests, benchmarks, the end of a profile)."""
        self._worker.wait_idle()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(s.variants) for s in self._skeletons.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            c = self.counters
            return {
                "requests": c.requests,
                "hits": c.hits,
                "misses": c.misses,
                "compiles": c.compiles,
                "failures": c.failures,
                "compile_ms": round(c.compile_ms, 1),
                "graphs": sum(len(s.variants) for s in self._skeletons.values()),
            }


class GroupKey:
    """A group's structural key, hashed once: it is looked up several times per flush."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupKey) and self._hash == other._hash and self.parts == other.parts


def short_hash(skeleton: GroupKey, key: tuple) -> str:
    return f"{hash((skeleton, key)) & 0xFFFFFFFFFFFF:012x}"


def explain_miss(previous: GroupKey, current: GroupKey) -> str:
    """What differs between two skeletons of one op sequence, in words (the first difference)."""
    old_ops, old_inputs, old_outputs, old_device = previous.parts
    new_ops, new_inputs, new_outputs, new_device = current.parts
    if old_device != new_device:
        return f"device changed {old_device} → {new_device}"
    if len(old_inputs) != len(new_inputs):
        return f"it reads {len(new_inputs)} tensors instead of {len(old_inputs)}"
    for index, (old, new) in enumerate(zip(old_inputs, new_inputs, strict=True)):
        if old != new:
            what = ("shape", "stride", "storage offset", "dtype", "aliasing")
            field = next(k for k in range(5) if old[k] != new[k])
            return f"input {index} {what[field]} changed {_plain(old[field])} → {_plain(new[field])}"
    for index, (old, new) in enumerate(zip(old_ops, new_ops, strict=True)):
        if old != new:
            return f"arguments of op #{index} changed (a shape, size or constant)"
    if old_outputs != new_outputs:
        return "a different set of its results is still in use"
    return "its structure changed"


def _plain(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value).removeprefix("torch.")
