"""``%run script.py`` in compile cells, compiled by Python once, so Dynamo's work carries over.

Dynamo keeps what it compiled on the code object it compiled (a frame's cache entries, each
with its guards). IPython's ``%run`` compiles the script's source afresh every time, so each
run's functions are new code objects with empty caches: a script run twice in compile mode
paid its whole Dynamo and Inductor compile twice (measured on a 16-step training script: 5
graphs again, 0.6 s). ``ScriptCode`` hands ``%run`` the same code object for the same file
and source, as Python's import system does for a module, so a second run finds the first
run's compiled code and reuses it wherever the guards pass. A changed file compiles anew.

Dynamo's compiled code reads helpers it put into the frame's globals (``__compiled_fn_*``,
``__resume_at_*``, ``__import_*``...), and ``%run`` clears the script's namespace before each
run (IPython reuses one per file): the guards of a resume function do not check those names,
so its cached code would fail with a ``NameError`` (measured on a GPT training script). The
helpers of the last run are put back into the cleared namespace before the next one: only
names the script's own code never mentions, in Dynamo's naming scheme.

The hooks are the two names IPython looks up to run a file: the builtin ``compile``, read
from the globals of ``IPython.core.interactiveshell``, and the shell's ``safe_execfile``.
``ScriptCode.serving`` sets both for the compile cell only and takes them away after.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

_HOOK = "compile"
#: Names Dynamo installs into a frame's globals: ``__compiled_fn_3_<uuid>``, ``__resume_at_30_2``,
#: ``__builtins_dict___4``, ``__import_torch_dot_nn``, ``___module_iter_<id>_c10``, ``_<id>_c3``.
_DYNAMO_GLOBAL = re.compile(r"^(?:__(?!.*__$)\w+|_\d+_c\d+)$")


class ScriptCode:
    """One code object per script file (the last source it was compiled from and its code),
    and the Dynamo helpers its namespace held after its last run."""

    def __init__(self) -> None:
        self._codes: dict[str, tuple[Any, CodeType, frozenset[str]]] = {}
        self._helpers: dict[str, dict[str, Any]] = {}

    def __call__(
        self,
        source: Any,
        filename: Any,
        mode: str,
        flags: int = 0,
        dont_inherit: bool = False,
        optimize: int = -1,
    ) -> Any:
        # dont_inherit: the caller's module (IPython's) has no __future__ imports; this one has
        if mode != "exec" or flags or optimize != -1 or not isinstance(filename, (str, os.PathLike)):
            return builtins.compile(source, filename, mode, flags, True, optimize)
        path = os.fspath(filename)
        cached = self._codes.get(path)
        if cached is not None and cached[0] == source:
            return cached[1]
        code = builtins.compile(source, path, mode, 0, True)
        self._codes[path] = (source, code, frozenset(_names_in(code)))
        self._helpers.pop(path, None)
        return code

    def _run_file(self, run: Any, fname: Any, *where: Any, **options: Any) -> Any:
        """``safe_execfile`` with the last run's Dynamo helpers back in the script's namespace."""
        path = os.fspath(Path(fname).expanduser().resolve())  # as safe_execfile names it
        namespace = where[0] if where and isinstance(where[0], dict) else None
        if namespace is not None:
            for name, value in self._helpers.get(path, {}).items():
                namespace.setdefault(name, value)
        try:
            return run(fname, *where, **options)
        finally:
            cached = self._codes.get(path)
            if namespace is not None and cached is not None:
                mentioned = cached[2]
                self._helpers[path] = {
                    name: value
                    for name, value in namespace.items()
                    if name not in mentioned and _DYNAMO_GLOBAL.match(name)
                }

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Be how ``%run`` compiles and runs a file while the block runs (a compile cell)."""
        found = _ipython()
        if found is None or _HOOK in vars(found[0]) or "safe_execfile" in vars(found[1]):
            yield  # not in IPython, or IPython changed how it runs files: stay out
            return
        module, shell = found
        run = shell.safe_execfile
        setattr(module, _HOOK, self)
        shell.safe_execfile = lambda fname, *where, **options: self._run_file(run, fname, *where, **options)
        try:
            yield
        finally:
            vars(module).pop(_HOOK, None)
            vars(shell).pop("safe_execfile", None)


def _names_in(code: CodeType) -> Iterator[str]:
    """Every name the script's code (and the code nested in it) reads or binds."""
    yield from code.co_names
    yield from code.co_varnames
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _names_in(constant)


def _ipython() -> tuple[ModuleType, Any] | None:
    """IPython's shell module and the running shell, or None outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.core import interactiveshell
    except ImportError:
        return None
    shell = get_ipython()
    return (interactiveshell, shell) if shell is not None else None
