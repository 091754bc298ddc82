"""What a failed cell shows when tpunb ran part of it: the user's frames and the message.

An error in a ``%%tpu_mode`` cell, or in any cell whose ops went through tpunb (a fused or
debug scope, a compiled cell), passes through tpunb's magic, its dispatch modes, PyTorch's
autograd and Dynamo: 40 to 280 lines, the first frame ``get_ipython().run_cell_magic(...)``,
frames of ``fuse/groups/flush.py`` that read like a tpunb bug, and the line that explains at the
bottom. Where tpunb is among the frames, the traceback IPython shows keeps only the user's
frames: the magic's call, tpunb's, PyTorch's (``torch``, ``torch_xla``, ``torch_tpu``),
IPython's and the standard library's frames go (``source.is_internal_file``), and so does a
chained exception none of whose frames are the user's (tpunb's errors repeat its message). A
cell in strict mode, which tpunb leaves alone, fails exactly as in plain IPython. ``%xmode
Verbose`` or ``TPUNB_VERBOSE_ERRORS=1`` shows it all.

Only what is shown changes: the exception, its type, message, traceback and chain, reach
``sys.last_value``, ``%debug`` and the kernel reply's ename and evalue unchanged; syntax errors, usage errors
and a user's own ``set_custom_exc`` handler are IPython's as before.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from tpunb.source import is_internal_file

#: A frame at a tpunb cell magic: its call, as IPython compiles the cell, or its header line
#: (where a compiled cell's wrapper runs).
MAGIC_LINES = ("get_ipython().run_cell_magic('tpu_", "%%tpu_")
VERBOSE_ENV = "TPUNB_VERBOSE_ERRORS"


_TPUNB_DIR = str(Path(__file__).resolve().parent) + os.sep
_ORIGINAL_ATTR = "_tpunb_original_showtraceback"


def install_tracebacks(shell: Any) -> None:
    """Route the shell's ``showtraceback`` (where IPython shows every error a cell raised as it
    ran) through ``users_frames``; once per shell."""
    if getattr(shell, _ORIGINAL_ATTR, None) is None:
        setattr(shell, _ORIGINAL_ATTR, shell.showtraceback)
        shell.showtraceback = functools.partial(_show, shell)


def uninstall_tracebacks(shell: Any) -> None:
    original = getattr(shell, _ORIGINAL_ATTR, None)
    if original is not None:
        shell.showtraceback = original
        setattr(shell, _ORIGINAL_ATTR, None)


def _show(shell: Any, exc_tuple: tuple | None = None, *args: Any, **kwargs: Any) -> None:
    """IPython's display of the error, with ``users_frames(tb)`` where tpunb is among the
    frames; ``sys.last_traceback`` (for ``%debug``) keeps them all."""
    original = getattr(shell, _ORIGINAL_ATTR)
    etype, value, tb = exc_tuple or sys.exc_info()
    if (
        value is None
        or os.environ.get(VERBOSE_ENV) == "1"
        or shell.InteractiveTB.mode == "Verbose"
        or not _through_tpunb(tb)
    ):
        original(exc_tuple, *args, **kwargs)
        return
    with _internal_chain_hidden(value):
        original((etype, value, users_frames(tb)), *args, **kwargs)
    sys.last_traceback = tb


def show_message_only(shell: Any, error: BaseException) -> None:
    """Show an error no frame of the user's raised (a cell's deferred work failing as its scope
    closed after the cell's code had run): its message, which names the line that recorded the
    work, without tpunb's frames or a chained error raised wholly inside internals.
    ``%debug`` still walks every frame."""
    original = getattr(shell, _ORIGINAL_ATTR, None) or shell.showtraceback
    with _internal_chain_hidden(error):
        original((type(error), error, None))
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__


def _through_tpunb(tb: TracebackType | None) -> bool:
    return any(_file(frame).startswith(_TPUNB_DIR) for frame in _frames(tb))


def users_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without internal frames; its first frame (IPython's, which the printer skips
    with its ``tb_offset``) stays."""
    frames = list(_frames(tb))
    if not frames:
        return tb
    kept = [frames[0], *(f for f in frames[1:] if _users(f))]
    rebuilt = None
    for frame in reversed(kept):
        rebuilt = TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def _users(tb: TracebackType) -> bool:
    filename = _file(tb)
    if is_internal_file(filename) or tb.tb_frame.f_locals.get("__tracebackhide__"):
        return False
    return not linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).startswith(MAGIC_LINES)


@contextlib.contextmanager
def _internal_chain_hidden(value: BaseException) -> Iterator[None]:
    """While the traceback is printed: no chained exception raised wholly inside internals."""
    saved = value.__cause__, value.__context__, value.__suppress_context__
    chained = value.__cause__ or (None if value.__suppress_context__ else value.__context__)
    if chained is not None and not any(_users(f) for f in _frames(chained.__traceback__)):
        value.__cause__, value.__suppress_context__ = None, True
    try:
        yield
    finally:
        value.__cause__, value.__context__, value.__suppress_context__ = saved


def _frames(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _file(tb: TracebackType) -> str:
    name = tb.tb_frame.f_code.co_filename
    return os.path.realpath(name) if os.path.isabs(name) else name
