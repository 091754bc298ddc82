"""PyTorch's compiler warnings that tpunb's own machinery causes, kept out of the user's cells.

Fused and compile modes run Dynamo, AOTAutograd and Inductor on the user's behalf: on the
notebook thread (a cell's compiled function, a hot call) and on tpunb's threads (background
compiles). Those compilers warn about things the user did not write and cannot change:
Dynamo tracing IPython's ``run_line_magic`` for a ``%run`` line ("does not know how to trace
the builtin ``sys._getframe``"), Dynamo hitting the recompile limit tpunb lowered to stop a
storm, Inductor importing a module with a deprecated decorator. tpunb says what matters in
its own words (the cell summary names graph breaks, recompiles and storms), so the compilers'
versions are noise.

While a fused or compile scope is open on the notebook thread (``quiet()``), and always on
threads named ``tpunb-*``, warnings raised from inside PyTorch's compiler packages or from
anywhere while they trace or compile (their entry points on the stack), and WARNING-level
records of their loggers, are held back, not printed. Nothing is lost: the last
``KEPT`` of them are in ``tpunb.stats()["hidden_warnings"]``. The user's own warnings (raised
from their code, or from PyTorch about their code outside the compilers) still show, and so
does everything in strict and debug mode; errors and the logs the user turned on
(``TORCH_LOGS``, INFO and below) are never held back.

A runtime can also hold back a warning it raises from its own code on the user's behalf
(``hold_runtime_warnings``): TorchTPU reads a tensor's ``.grad`` inside every copy to the host,
so each ``loss.item()`` warned about reading ``.grad`` of a non-leaf tensor.

``warnings.showwarning`` is wrapped, not replaced by a filter: ``warnings`` filters are
process-wide and ``catch_warnings`` is not thread-safe, while the wrapper decides per call on
the thread that warns. A handler filter on the ``torch`` loggers does the same for logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

#: Where PyTorch's compilers live, as package paths under ``torch/``.
_COMPILER_PACKAGES = (
    "_dynamo",
    "_inductor",
    "_functorch",
    "fx",
    "_subclasses",
    "_higher_order_ops",
    "_logging",
)
_COMPILER_LOGGERS = tuple(f"torch.{package}" for package in _COMPILER_PACKAGES)
_COMPILER_PATHS = tuple(f"{os.sep}torch{os.sep}{package}{os.sep}" for package in _COMPILER_PACKAGES)
#: Where a compile is under way: Dynamo converting a frame, AOTAutograd and Inductor compiling.
_COMPILING_FILES = tuple(
    os.path.join("torch", *parts)
    for parts in (
        ("_dynamo", "convert_frame.py"),
        ("_functorch", "aot_autograd.py"),
        ("_inductor", "compile_fx.py"),
    )
)
#: tpunb's own threads (the background compiler, the memory sampler) start with this.
THREAD_PREFIX = "tpunb-"
#: How many held-back messages ``hidden()`` keeps.
KEPT = 20

#: Dynamo's helper whose cleanup error ``_QuietUnraisable`` drops (built now: at interpreter
#: exit the hook still runs while module globals such as ``os`` may already be gone).
_DYNAMO_UTILS = os.path.join("torch", "_dynamo", "utils.py")

#: Says whether a warning (its text, file and line) is a runtime's own, raised on the user's
#: behalf from code they did not write; such warnings are held back on every thread.
RuntimeNoise = Callable[[str, str, int], bool]

_state = threading.local()
_hidden: deque[str] = deque(maxlen=KEPT)
_runtime_noise: list[RuntimeNoise] = []


def _on_tpunb_thread() -> bool:
    return threading.current_thread().name.startswith(THREAD_PREFIX)


def _quiet_here() -> bool:
    return getattr(_state, "depth", 0) > 0 or _on_tpunb_thread()


def _held_warning(filename: str) -> bool:
    """Whether a warning attributed to ``filename`` is the compilers' and raised while tpunb
    compiles: anything on tpunb's own threads; on the notebook thread in a quiet block, one
    raised in the compilers' code, or anywhere while they compile (Inductor importing a
    module whose deprecated decorator warns, say)."""
    if _on_tpunb_thread():
        return True
    if getattr(_state, "depth", 0) == 0:
        return False
    return any(path in filename for path in _COMPILER_PATHS) or _compiling()


def _compiling() -> bool:
    """Whether a compiler is tracing or compiling on this thread now (its entry points are on
    the stack; compiled code running is not: it runs from the user's frames)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_COMPILING_FILES):
            return True
        frame = frame.f_back
    return False


def _hold(text: str, held: deque[str] = _hidden) -> None:
    """Keep ``text``'s first line (``held`` bound here: at interpreter exit the module's globals
    may already be None when the unraisable hook calls this)."""
    line = text.strip().splitlines()[0] if text.strip() else text
    if line not in held:
        held.append(line)


def hidden() -> list[str]:
    """The compiler warnings held back most recently, first lines only, oldest first."""
    return list(_hidden)


class _QuietShowwarning:
    """``warnings.showwarning`` that holds back the compilers' warnings while tpunb compiles."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, message: Any, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
        if _held_warning(filename) or any(noise(str(message), filename, lineno) for noise in _runtime_noise):
            _hold(f"{category.__name__}: {message}")
            return
        self.inner(message, category, filename, lineno, *rest)


class _QuietRecords(logging.Filter):
    """Holds back the compilers' WARNING records while tpunb compiles."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.name.startswith(_COMPILER_LOGGERS) and _quiet_here():
            _hold(f"{record.name}: {record.getMessage()}")
            return False
        return True


_RECORD_FILTER = _QuietRecords()


class _QuietUnraisable:
    """``sys.unraisablehook`` that drops one harmless error of Dynamo's: when compiled code
    dies, Dynamo deletes the helper globals it put into the frame's namespace, and a
    namespace ``%run`` cleared meanwhile no longer has them (``KeyError: '__builtins_dict___4'``,
    printed as "Exception ignored in ..." at garbage collection). It keeps what it needs on
    itself: at interpreter exit, when most of those errors come, module globals may be gone."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._dynamo_utils = _DYNAMO_UTILS
        self._hold = _hold

    def __call__(self, unraisable: Any) -> None:
        if self._dynamo_cleanup_error(unraisable):
            self._hold(f"torch._dynamo cleanup: KeyError {unraisable.exc_value}")
            return
        self.inner(unraisable)

    def _dynamo_cleanup_error(self, unraisable: Any) -> bool:
        error, trace = unraisable.exc_value, unraisable.exc_traceback
        while trace is not None and trace.tb_next is not None:
            trace = trace.tb_next
        code = trace.tb_frame.f_code if trace is not None else None
        return (
            isinstance(error, KeyError)
            and code is not None
            and code.co_name == "__call__"
            and code.co_filename.endswith(self._dynamo_utils)
        )


def _install() -> None:
    """Wrap ``showwarning`` and ``unraisablehook`` and filter the torch loggers' handlers, again
    if someone replaced them since (``catch_warnings`` restores the old ``showwarning``;
    ``torch._logging.set_logs`` makes new handlers)."""
    if not isinstance(warnings.showwarning, _QuietShowwarning):
        warnings.showwarning = _QuietShowwarning(warnings.showwarning)
    if not isinstance(sys.unraisablehook, _QuietUnraisable):
        sys.unraisablehook = _QuietUnraisable(sys.unraisablehook)
    loggers = [
        logging.getLogger(name)
        for name in list(logging.Logger.manager.loggerDict)
        if name.startswith("torch")
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if _RECORD_FILTER not in handler.filters:
                handler.addFilter(_RECORD_FILTER)


def hold_runtime_warnings(noise: RuntimeNoise) -> None:
    """Hold back, from now on and on every thread, the warnings ``noise`` says are the
    runtime's own (kept in ``hidden()`` like the compilers')."""
    if noise not in _runtime_noise:
        _runtime_noise.append(noise)
    _install()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Hold back the compilers' warnings on this thread while the block runs (nests)."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
