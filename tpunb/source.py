"""Find the user's line behind an op: the first frame outside torch, tpunb and the stdlib.

Errors in debug (and later fused) mode must point at the notebook cell, not at a frame deep
inside torch. Walking ``f_back`` and caching the verdict per code object keeps this cheap
enough (about a microsecond) to do for every op.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass
from types import CodeType, FrameType


def _dir_prefix(path: str | None) -> str | None:
    return os.path.abspath(path) + os.sep if path else None


def _package_dir(module_name: str) -> str | None:
    path = getattr(sys.modules.get(module_name), "__file__", None)
    return _dir_prefix(os.path.dirname(path)) if path else None


@dataclass(frozen=True)
class _Prefixes:
    """Directories that decide whether a frame is internal."""

    packages: tuple[str, ...]  # tpunb, torch, IPython, ipykernel: always internal
    stdlib: str  # internal too...
    site: tuple[str, ...]  # ...except site-packages, which can live inside it (no venv)

    @classmethod
    def discover(cls) -> _Prefixes:
        names = ("tpunb", "torch", "torch_xla", "torch_tpu", "IPython", "ipykernel")
        packages = [_package_dir(name) for name in names]
        paths = sysconfig.get_paths()
        site = {_dir_prefix(paths.get("purelib")), _dir_prefix(paths.get("platlib"))}
        return cls(
            packages=tuple(d for d in packages if d),
            stdlib=_dir_prefix(paths.get("stdlib")) or "\0",
            site=tuple(d for d in site if d),
        )

    def internal(self, filename: str) -> bool:
        if filename.startswith("<frozen"):
            return True
        path = os.path.abspath(filename)
        if path.startswith(self.packages):
            return True
        return path.startswith(self.stdlib) and not path.startswith(self.site)


_verdicts: dict[CodeType, bool] = {}
_prefixes: _Prefixes | None = None


def is_internal_file(filename: str) -> bool:
    """Whether ``filename`` belongs to tpunb, torch, a TPU runtime, IPython or the stdlib."""
    global _prefixes
    if _prefixes is None:
        _prefixes = _Prefixes.discover()
    return _prefixes.internal(filename)


def _is_internal(code: CodeType) -> bool:
    verdict = _verdicts.get(code)
    if verdict is None:
        verdict = _verdicts[code] = is_internal_file(code.co_filename)
    return verdict


@dataclass(frozen=True)
class SourceLocation:
    """Where an op was issued, with a human label such as ``Cell In[3], line 2``."""

    filename: str
    lineno: int
    label: str
    code: str

    def __str__(self) -> str:
        return f"{self.label}: {self.code}" if self.code else self.label


def _label(filename: str, lineno: int) -> str:
    """IPython names cells ``Cell In[N]``; use that when the file is a cell."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    compiler = getattr(shell, "compile", None)
    named = compiler.format_code_name(filename) if hasattr(compiler, "format_code_name") else None
    if named:
        return f"{named[0]} {named[1]}, line {lineno}"
    return f"{os.path.basename(filename)}:{lineno}"


def user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame that belongs to the user's code, or None."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code):
        frame = frame.f_back
    return frame


def location_of(filename: str, lineno: int) -> SourceLocation:
    """A labelled location with its source line (when linecache has the file or cell)."""
    return SourceLocation(
        filename, lineno, _label(filename, lineno), linecache.getline(filename, lineno).strip()
    )


#: Each code object's labelled lines, made once: a hot call or a flush names its user's line
#: at every step, and labelling it (IPython's cell name, linecache) costs more than finding it.
_locations: weakref.WeakKeyDictionary[CodeType, dict[int, SourceLocation]] = weakref.WeakKeyDictionary()


def locate(frame: FrameType | None = None) -> SourceLocation | None:
    """The user's location for the current call stack (or from ``frame`` outward)."""
    found = user_frame(frame if frame is not None else sys._getframe(1))
    if found is None:
        return None
    code, lineno = found.f_code, found.f_lineno
    lines = _locations.get(code)
    if lines is None:
        lines = _locations[code] = {}
    where = lines.get(lineno)
    if where is None:
        where = lines[lineno] = location_of(code.co_filename, lineno)
    return where


def running_cell_number(shell: object) -> int:
    """The number of the cell running now, as its prompt and its tracebacks show it (``In[N]``).

    IPython 9 counts a cell before running it (``shell.execution_count`` is then the *next*
    cell's number) where IPython 8 counted it after; its display hook's ``prompt_count`` is
    the running cell's number on both (it numbers the cell's ``Out[N]``)."""
    return shell.displayhook.prompt_count  # type: ignore[attr-defined]
