"""Interrupts (Ctrl-C, a kernel's "interrupt") land between ops, never inside the engine.

Recording an op or handing a group's results back takes several Python steps: an input
registered, a wrapper pointed at an op of the current trace, results assigned one by one.
A KeyboardInterrupt raised halfway through would leave wrappers pointing into a trace that
no longer exists, and the next group would wire them to unrelated ops. So, inside a fused
scope, SIGINT received while the engine is busy is held until the engine's outermost call
returns, and then delivered exactly as it would have been; received anywhere else (the
user's own Python code), it is delivered at once.

An interrupt is also never lost to a finalizer. Python runs a signal's handler at the next
bytecode of the main thread, and that can be inside a weakref callback or a ``__del__``
(PyTorch's weak dictionaries run one whenever a tensor they key dies, many times a step):
a KeyboardInterrupt raised there is printed as "Exception ignored" and dropped, and the
cell runs on. So while the guard is installed, a KeyboardInterrupt that reaches
``sys.unraisablehook`` is sent to the main thread again, a moment later, by a thread that was
started beforehand and waits for such requests: the hook only queues one (a C call that
never blocks), so the hook has returned before the interrupt can land. Sent from within the
hook, it would land there and be dropped again; a thread started by the hook did exactly
that on a loaded machine (the hook waits for the thread to start, and the thread's timer ran
out first). Should the interrupt land in another finalizer, it is sent again.

Only the main thread's calls count: Python runs signal handlers there, and only there can a
held interrupt be delivered. A tensor of the engine's touched on another thread (a compile
worker, a thread of the user's) passes through the guard without holding anything; counted,
it would hold the notebook's interrupt until that thread left, then raise it on that thread,
and the cell would never stop.
"""

from __future__ import annotations

import _queue
import _signal
import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from tpunb.fuse import config

Handler = Callable[[int, FrameType | None], Any]
#: The name of the thread that sends a dropped interrupt again (one per process, once needed).
RESENDER = "tpunb-interrupts"


class InterruptGuard:
    """Holds SIGINT while the engine is busy (``with guard:``); ``installed()`` arms it."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._depth = 0  # the main thread's engine calls under way
        self._held: tuple[int, FrameType | None] | None = None
        self._previous: list[Handler] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Route SIGINT through the guard for the duration (main thread only: elsewhere
        Python cannot set signal handlers, and signals are delivered to the main thread)."""
        if _thread.get_ident() != self._main:
            yield
            return
        # (``_signal``, under ``signal``: its enum conversions cost a notebook's scope per step
        # 20 us; one swap returns the handler to put back, as it was)
        outer = _signal.signal(_signal.SIGINT, self._on_signal)
        self._previous.append(_as_callable(outer))
        unraisable = sys.unraisablehook
        _RESENDER.ready()
        sys.unraisablehook = _interrupts_sent_again(unraisable)
        try:
            yield
        finally:
            sys.unraisablehook = unraisable
            self._previous.pop()
            _signal.signal(_signal.SIGINT, outer)

    def __enter__(self) -> None:
        if _thread.get_ident() == self._main:
            self._depth += 1

    def __exit__(self, *exc_info: object) -> None:
        if _thread.get_ident() != self._main:
            return
        self._depth -= 1
        if self._depth == 0 and self._held is not None:
            signum, frame = self._held
            self._held = None
            self._deliver(signum, frame)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._depth > 0:
            self._held = (signum, frame)
        else:
            self._deliver(signum, frame)

    def _deliver(self, signum: int, frame: FrameType | None) -> None:
        handler = self._previous[-1] if self._previous else signal.default_int_handler
        handler(signum, frame)


class _Resender:
    """The thread that sends the main thread an interrupt a finalizer dropped, once the hook
    that asked has returned; started outside any hook (``ready``), restarted after a fork."""

    def __init__(self) -> None:
        self._requests: _queue.SimpleQueue[None] = _queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def ready(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name=RESENDER, daemon=True)
            self._thread.start()

    def request(self) -> None:
        self._requests.put(None)

    def _serve(self) -> None:
        while True:
            self._requests.get()
            time.sleep(config.RESEND_AFTER_S)
            _thread.interrupt_main()


_RESENDER = _Resender()


def _interrupts_sent_again(report: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``sys.unraisablehook`` that has a KeyboardInterrupt a finalizer swallowed sent to the
    main thread again, and reports anything else as ``report`` does."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _RESENDER.request()
        else:
            report(unraisable)

    return hook


def _as_callable(handler: Any) -> Handler:
    """The handler to delegate to: SIG_IGN ignores, SIG_DFL and None act as Python's default."""
    if handler == signal.SIG_IGN:
        return lambda signum, frame: None
    if callable(handler):
        return handler
    return signal.default_int_handler
