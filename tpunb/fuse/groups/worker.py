"""The compile worker: one background thread that compiles fused groups.

A group compiles on its second sighting (plan.py's rule) while the notebook keeps running: the main thread
replays the group op by op meanwhile. One worker (compiles are seconds of CPU each, and
Inductor's state is process-wide) that takes Dynamo's compile lock, and shortens the
interpreter's thread switch interval while it works so replay on the main thread keeps pace.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tpunb.fuse import config
from tpunb.fuse.workarounds import (
    compile_calls_beside_worker_traces,
    compile_worker_thread,
    keep_rng_states_beside_worker,
    trace_inductor_helpers_here,
)


class CompileWorker:
    """Runs compile jobs one at a time on a thread started on first use."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._busy = False
        self._idle_since = 0.0  # when its last job ended (``time.perf_counter``)

    def submit(self, job: Callable[[], None], wait: bool) -> Future:
        if self._executor is None:
            trace_inductor_helpers_here()
            compile_calls_beside_worker_traces()
            keep_rng_states_beside_worker()
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpunb-compile")
        future = self._executor.submit(self._run, job)
        if wait:
            future.result()
        return future

    def _run(self, job: Callable[[], None]) -> None:
        self._busy = True
        try:
            with compile_worker_thread(), quick_thread_switches(), one_compiler_at_a_time():
                job()
        finally:
            self._idle_since = time.perf_counter()  # (before ``_busy``: a reader sees both)
            self._busy = False

    def quiet_since(self, started: float) -> bool:
        """Whether it has compiled nothing since ``started`` (a ``time.perf_counter`` time).

        A run on the notebook thread timed across a compile ran beside it, slowed by it (the
        GIL, the cores): an optimizer step of ignite's small MLP took 4-20 ms so against 0.2 ms
        alone, and compared with such runs its compiled step (0.2-0.4 ms) looked faster. Hot
        calls and steps compare only runs timed while the worker was quiet (payoff.py)."""
        return not self._busy and self._idle_since <= started

    def wait_idle(self) -> None:
        """Block until queued jobs finish (tests and benchmarks)."""
        if self._executor is not None:
            self._executor.submit(lambda: None).result()


def one_compiler_at_a_time() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's own compile lock, held while the worker compiles a group: Dynamo converting a
    frame on the main thread (a compile-mode cell, ``tpunb.compile``) and Inductor compiling a
    group share compiler state and process-wide config, so they take turns. A torch without
    the lock (another layout) gets none, as before."""
    lock = _compile_lock()
    return lock if lock is not None else contextlib.nullcontext()


#: Why a call compiled whole ran as it is: the worker held the compiler (a group row's reason).
COMPILER_BUSY = "run as it is: the compile worker was busy, so it compiles at a later call"


class compiling_only_if_free:
    """Around a call Dynamo may have to compile on the notebook thread (a hot module call, a
    hot optimizer step), which must not wait for the worker's compile (seconds, a minute for a
    model's backward): with the compiler free, the call holds its lock (the worker starts its
    next job after it) and may compile; with the worker compiling, the call runs in Dynamo's
    ``eager_on_recompile`` stance, where compiled code whose guards pass runs and anything
    else runs as it is, taking no lock. ``wait`` (``--sync-compile``, which asks for compiled
    code at once) takes the lock however long the worker holds it. Entering gives whether the
    call could compile. A class, not a generator: every hot call and step enters one."""

    def __init__(self, wait: bool) -> None:
        self.wait = wait
        self.lock: Any = None
        self.stance: Any = None

    def __enter__(self) -> bool:
        lock = _compile_lock()
        if lock is None or lock.acquire(blocking=self.wait):
            self.lock = lock
            return True
        import torch

        self.stance = torch.compiler.set_stance("eager_on_recompile")
        self.stance.__enter__()
        return False

    def __exit__(self, *exc_info: Any) -> None:
        if self.lock is not None:
            self.lock.release()
        elif self.stance is not None:
            self.stance.__exit__(*exc_info)


@functools.cache
def _compile_lock() -> Any:
    """Dynamo's compile lock (None in a torch without one), looked up once: every hot call
    and step asks."""
    from torch._dynamo import convert_frame

    return getattr(convert_frame, "compile_lock", None)


@contextlib.contextmanager
def quick_thread_switches() -> Iterator[None]:
    """While the worker compiles, the main thread keeps replaying groups: thousands of small
    ops, each releasing the GIL inside its kernel and then waiting to get it back. With the
    default 5 ms switch interval the compiling thread keeps the GIL for up to 5 ms each time
    (a convoy); a short interval bounds that wait. Measured on a 135M-parameter LoRA step
    replayed during compiles: about 14 s per step at 5 ms, about 10 s at 0.2 ms."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(config.COMPILE_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
