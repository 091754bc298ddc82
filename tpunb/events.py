"""Event records and the in-process bus that carries them from runtimes to views.

Data flows one way: cells -> runtime -> events -> views. Runtimes publish records here and
never know who reads them; the monitor, the lab extension and ``tpunb.stats()`` read the
bounded history. A record kind is just its class's ``kind`` string, so a new kind needs no
change in the bus or in views that list records generically.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

#: How many records of each kind are kept; old ones fall off the end.
HISTORY_PER_KIND = 256


@dataclass(frozen=True)
class Record:
    """Base of every event record: a kind and a wall-clock timestamp."""

    kind: ClassVar[str] = "record"
    time: float = field(default_factory=time.time, kw_only=True)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (the form views and ``stats()`` hand out)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class ModeChange(Record):
    """The default mode changed (``%tpu_mode``, ``set_mode`` or the lab picker)."""

    kind: ClassVar[str] = "mode"
    previous: str
    current: str
    source: str


@dataclass(frozen=True)
class CellRun(Record):
    """One notebook cell finished: the numbers behind the per-cell summary line."""

    kind: ClassVar[str] = "cell"
    cell: int | None
    mode: str
    wall_s: float
    peak_bytes: int | None
    groups: int
    cache_hits: int
    cache_misses: int
    error: str | None
    compiled_graphs: int = 0  # compile mode: new graphs and graph breaks in the cell
    graph_breaks: int = 0
    break_reasons: str | None = None  # compile mode: why the graphs broke, in Dynamo's words
    recompiles: str | None = None  # compile mode: why it recompiled, in words
    slower: str | None = None  # why it cost more: a mode measured faster, or fused's recording
    counters: dict[str, float] = field(default_factory=dict)  # runtime counters that moved
    precision: str = "fp32"  # the reduced precisions it ran in (%tpu_precision), else fp32
    compile_waited_s: float = 0.0  # compile mode: waited for fused groups compiling in the background
    storm: str | None = None  # compile mode: the recompile storm stopped in the cell
    peak_flops: float | None = None  # the device's peak FLOP/s, where its MFU is reported


class GroupStatus(StrEnum):
    """What happened to a fusion group: the one vocabulary every runtime writes into its
    records and every view reads (the monitor's script too, which styles a row by it:
    ``tpunb-status-compile-failed`` in monitor.css). Its members are strings, so records stay
    plain JSON for the comm, the widget and ``tpunb.stats()``."""

    HIT = "hit"  # ran compiled code the cache already had
    MISS = "miss"  # seen first: ran op by op (or compiled first, with --sync-compile)
    COMPILING = "compiling"  # ran op by op while its compile runs in the background
    OP_BY_OP = "op by op"  # ran op by op, not compiled now: too small, warming, storming or once
    # a cell (plan.py), its compile failed or is off, Dynamo refused it, or (hot calls and steps)
    # not yet paid for. (Not "eager": that word is torch's mode, and TorchTPU's.)
    COMPILED = "compiled"  # (views) its background compile has finished since it last ran
    COMPILE_FAILED = "compile failed"  # (views, and runtimes that compile as they run) it failed


#: The end of a hot optimizer step's group key, after the optimizer's class (fuse/hot/hotsteps.py).
OPTIMIZER_STEP_SUFFIX = "-step"


@dataclass(frozen=True)
class FusionGroup(Record):
    """One flushed group of recorded ops (the fused engine's unit of work)."""

    kind: ClassVar[str] = "group"
    key: str
    ops: int
    top_ops: dict[str, int]
    input_shapes: list[list[int]]
    trigger: str  # what flushed it, and where: "item at Cell In[7], line 3"
    source: str  # where its first op was recorded
    status: GroupStatus
    compile_ms: float | None  # a compile this group's run waited for (part of run_ms)
    run_ms: float
    lifted: int  # floats fed as inputs instead of baked in
    miss_reason: str | None = None  # on a miss: what differs from the last group of the same ops
    plan: str | None = None  # why it ran compiled or op by op, and whether it compiles (fuse/groups/plan.py)
    capture_ms: float = 0.0  # the engine's time recording its ops, before it ran
    eager_ms: float | None = None  # its ops run one by one, when it last replayed (strict's cost)
    wait: bool = False  # flushed because the host needed values now (a read, an op that cannot wait)
    at: str | None = None  # the user's line that flushed it: "Cell In[7], line 3"
    # a hot module call or optimizer step compiled whole (fuse/hot/hotcalls.py, hotsteps.py), not recorded ops
    whole_call: bool = False

    @property
    def optimizer_step(self) -> bool:
        """Whether this is a hot optimizer step's record (keyed ``AdamW-step``)."""
        return self.whole_call and self.key.endswith(OPTIMIZER_STEP_SUFFIX)


@dataclass(frozen=True)
class CompileDone(Record):
    """A group finished compiling (on the worker thread)."""

    kind: ClassVar[str] = "compile"
    key: str
    ok: bool
    compile_ms: float
    error: str | None


@dataclass(frozen=True)
class CompiledCell(Record):
    """One run of a compile-mode cell (or a ``tpunb.compile`` function that compiled)."""

    kind: ClassVar[str] = "compiled"
    cell: int | None
    key: str
    graphs: int  # new graphs compiled by this run (0: everything came from Dynamo's cache)
    frames: int  # frames Dynamo converted
    graph_breaks: dict[str, int]  # Dynamo's break reasons, shortened
    recompile_reasons: list[str]  # failed guards in words: "x.shape[0] changed 64 → 17"
    fx_cache_hits: int  # Inductor FX-graph cache (on disk)
    fx_cache_misses: int
    wall_ms: float
    error: str | None
    waited_ms: float = 0.0  # waited, before running, for fused groups compiling in the background
    storm: str | None = None  # the frame whose recompiles were stopped, and its guard (recompiles.py)


Subscriber = Callable[[Record], None]


class EventBus:
    """A thread-safe, bounded history of records per kind, plus optional subscribers.

    Subscribers run on the publishing thread and must be quick; a failing subscriber is
    dropped rather than allowed to break the cell that published.
    """

    def __init__(self, history: int = HISTORY_PER_KIND) -> None:
        self._history = history
        self._lock = threading.Lock()
        self._records: dict[str, deque[Record]] = {}
        self._counts: dict[str, int] = {}
        self._subscribers: list[Subscriber] = []

    def publish(self, record: Record) -> None:
        with self._lock:
            self._records.setdefault(record.kind, deque(maxlen=self._history)).append(record)
            self._counts[record.kind] = self._counts.get(record.kind, 0) + 1
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber(record)
            except Exception:
                self.unsubscribe(subscriber)

    def recent(self, kind: str, limit: int | None = None) -> list[Record]:
        """Records of one kind, newest last (at most ``limit`` of them)."""
        with self._lock:
            records = list(self._records.get(kind, ()))
        return records if limit is None else records[-limit:] if limit > 0 else []

    def count(self, kind: str) -> int:
        """How many records of ``kind`` were ever published (not just those kept)."""
        with self._lock:
            return self._counts.get(kind, 0)

    def subscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._counts.clear()
