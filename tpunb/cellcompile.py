"""Compile mode: a notebook cell becomes a function that ``torch.compile`` captures.

The cell keeps its meaning: every name it assigns at top level is declared ``global``, so it
lands in the user namespace; reads of existing globals work; ``print`` and display work (Dynamo
breaks the graph around them and runs them normally); the last expression is returned and
shown; the function is compiled under the cell's own file name and line numbers, so errors
point at the cell's line. The function object is kept per cell text, so running the same
cell again reuses Dynamo's cache instead of recompiling.

What each run compiled is read from Dynamo's and Inductor's own counters and published as a
``CompiledCell`` record.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

from tpunb.events import CompiledCell
from tpunb.recompiles import STORM_RECOMPILES, StormStopper, describe_frame, failure_counts, frame_recompiles
from tpunb.script_reuse import ScriptCode

#: Counters whose change says what a run compiled: (group, name) in torch._dynamo's counters.
_COUNTED = {
    "frames": ("frames", "ok"),
    "graphs": ("stats", "unique_graphs"),
    "fx_cache_hits": ("inductor", "fxgraph_cache_hit"),
    "fx_cache_misses": ("inductor", "fxgraph_cache_miss"),
}


class NotCompilable(Exception):
    """This cell cannot become a function (top-level ``return``, ``yield`` or ``await``)."""


def _assigned_names(body: list[ast.stmt]) -> list[str]:
    """Names a cell binds at its top level (not inside its own functions or classes)."""
    names: dict[str, None] = {}

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
            for decorator in node.decorator_list:
                visit(decorator)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names[node.id] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    raise NotCompilable("'from ... import *' inside a function")
                names[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(dict.fromkeys(node.names))
        elif isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)):
            raise NotCompilable(f"a top-level {type(node).__name__.lower()}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in body:
        visit(statement)
    return list(names)


class _Unassigned:
    """Stands in for a name a cell assigns but that does not exist yet: Dynamo cannot read back
    a global the same frame created, so the name exists (as this) until the cell assigns it."""

    def __repr__(self) -> str:
        return "<unassigned>"


UNASSIGNED = _Unassigned()


def cell_function(
    tree: ast.Module, filename: str, namespace: dict[str, Any]
) -> tuple[Callable[[], Any], list[str]]:
    """Turn a cell's module AST into a zero-argument function whose globals are ``namespace``;
    also return the names it assigns."""
    body = list(tree.body)
    names = _assigned_names(body)
    if body and isinstance(body[-1], ast.Expr):
        last = body.pop()
        body.append(ast.copy_location(ast.Return(value=last.value), last))
    statements: list[ast.stmt] = [ast.Global(names=names)] if names else []
    statements += body or [ast.Pass()]
    function = ast.FunctionDef(
        name="__tpunb_cell__",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=statements,
        decorator_list=[],
        returns=None,
        **({"type_params": []} if "type_params" in ast.FunctionDef._fields else {}),
    )
    module = ast.Module(body=[function], type_ignores=[])
    ast.fix_missing_locations(module)  # the wrapper lines take line 1; the body keeps the cell's
    scope: dict[str, Any] = {}
    exec(compile(module, filename, "exec"), namespace, scope)
    return scope["__tpunb_cell__"], names


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: counters[group][key] for name, (group, key) in _COUNTED.items()}


def _breaks() -> dict[str, int]:
    """Dynamo's break reasons with counts, and (under ``RESUMED``) the resume functions it made:
    one per break inside a frame, including breaks Dynamo handled without a reason."""
    from torch._dynamo.utils import counters

    return {**counters["graph_break"], RESUMED: sum(counters["resumes"].values())}


#: The resume functions Dynamo made, in ``_breaks()``'s counts.
RESUMED = "<resumed>"
#: What a break without a reason of its own is called (one resume function more than reasons).
UNEXPLAINED_BREAK = "a break without a reason from Dynamo (a print or another Python side effect)"


def _guard_failures(code: CodeType) -> list[str]:
    from torch._dynamo.utils import guard_failures

    return list(guard_failures.get(code, ()))


_SIZE_MISMATCH = re.compile(
    r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)\. expected (?P<old>\d+), actual (?P<new>\d+)"
)


_IDENTITY_GUARD = re.compile(r"^___check_(?P<kind>type|obj)_id\((?P<name>[^,]+), \d+\)")


def explain_guard(reason: str) -> str:
    """Dynamo's guard failure in words: ``x.shape[0] changed 64 → 17``."""
    text = reason.split(": ", 1)[-1] if re.match(r"^\d+/\d+: ", reason) else reason
    text = text.split("  # ", 1)[0].strip()  # Dynamo appends the guarded line as a comment
    text = re.sub(r"\b(?:L|G)\['(.+?)'\]", r"\1", text)  # the frame's locals and globals by name
    if text.startswith("BACKEND_MATCH"):
        return "compiled before with another compiler (yours, or a fused cell's for a compiled step)"
    if text.startswith("KeyError on __builtins_dict__"):
        return "its module's globals are a new namespace (a script run again with %run)"
    identity = _IDENTITY_GUARD.match(text)
    if identity is not None:
        name = identity["name"]
        if identity["kind"] == "type":
            return f"{name}'s class is not the one it was compiled for (a re-run script defines it anew)"
        return f"{name} is not the object it was compiled for (its identity is guarded)"
    match = _SIZE_MISMATCH.search(text)
    if match is None:
        return _short(text)
    name = re.sub(r"^(?:L|G)\['(.+?)'\]$", r"\1", match["name"])
    return f"{name}.shape[{match['dim']}] changed {match['old']} → {match['new']}"


def _new_breaks(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The breaks between two ``_breaks()`` counts, by short reason; resume functions beyond the
    breaks with reasons count as breaks without one."""
    new: dict[str, int] = {}
    for reason, count in after.items():
        if reason != RESUMED and count > before.get(reason, 0):
            words = break_in_words(reason)
            new[words] = new.get(words, 0) + count - before.get(reason, 0)
    unexplained = after[RESUMED] - before.get(RESUMED, 0) - sum(new.values())
    return {**new, UNEXPLAINED_BREAK: unexplained} if unexplained > 0 else new


#: Breaks whose cause Dynamo's reason names only from the inside, in the user's terms.
MAGIC_BREAK = "a %magic or !shell line (IPython runs it as plain Python, outside the graph)"
OPTIMIZER_BREAK = "a torch._dynamo.graph_break() call (torch.optim's step() makes two per step)"
BACKWARD_BREAK = "loss.backward() (autograd runs the compiled backward, outside the graph)"
LOOP_BREAK = "a graph break inside a loop (Dynamo runs that loop uncompiled; the calls it makes compile)"
_IPYTHON_FILE = re.compile(r"file `[^`]*[/\\]IPython[/\\]")
_SKIPPED_FUNCTION = re.compile(r"marked as skipped.*?the function `(?P<name>[^`]+)`", re.S)


def break_in_words(reason: str) -> str:
    """A graph break's reason as the user would say it: the magic line, the optimizer step,
    ``backward()``, a function kept out of the graph, else Dynamo's own explanation."""
    if _IPYTHON_FILE.search(reason):
        return MAGIC_BREAK
    if "User-inserted graph break. Message: None" in reason:
        return OPTIMIZER_BREAK
    if "Unsupported Tensor.backward() call" in reason:
        return BACKWARD_BREAK
    if reason.startswith("graph break in loop") or "\ngraph break in loop" in reason:
        return LOOP_BREAK
    skipped = _SKIPPED_FUNCTION.search(reason)
    if skipped is not None:
        return f"{skipped['name']} (runs outside the graph)"
    return _short(reason)


def _short(reason: str) -> str:
    """A reason's line that explains: Dynamo's "Explanation:" line when it gives one."""
    lines = [line.strip() for line in reason.strip().splitlines()]
    line = next((x.removeprefix("Explanation:").strip() for x in lines if x.startswith("Explanation:")), None)
    line = line or (lines[0] if lines else reason)
    return line if len(line) <= 160 else line[:157] + "..."


#: Counts the graphs a runtime compiled outside Dynamo's sight (None: Dynamo counts them).
GraphCounter = Callable[[], int | None]
#: Waits for compiles running off the notebook thread; returns the seconds waited.
BackgroundWait = Callable[[], float]


def _no_graph_counter() -> None:
    return None


def _nothing_to_wait_for() -> float:
    return 0.0


class CompileWatch:
    """What Dynamo and Inductor (or the runtime's own compiler) did between construction and
    ``record()``: recompiles of ``code`` (a ``tpunb.compile`` function, read per call), or
    with ``every_frame`` (a cell) of every frame Dynamo compiled meanwhile, each named."""

    def __init__(
        self,
        code: CodeType,
        graph_counter: GraphCounter = _no_graph_counter,
        waited_s: float = 0.0,
        every_frame: bool = False,
    ) -> None:
        self.code = code
        self._waited_s = waited_s
        self._graph_counter = graph_counter
        self._graphs = graph_counter()
        self._counters = _counters()
        self._breaks = _breaks()
        self._guards = len(_guard_failures(code))
        self._failures = failure_counts() if every_frame else None
        self._started = time.perf_counter()

    def _recompile_reasons(self) -> list[str]:
        own = [explain_guard(r) for r in _guard_failures(self.code)[self._guards :]]
        if self._failures is None:
            return own
        others = [
            f"{describe_frame(code)}{f' ×{count}' if count > 1 else ''}: {explain_guard(guard)}"
            for code, count, guard in frame_recompiles(self._failures)
            if code is not self.code
        ]
        return own + others

    def _storm(self) -> str | None:
        """The frame that recompiled most, in words, with its last failed guard."""
        stormed = frame_recompiles(self._failures or {})
        if not stormed:
            return None
        code, count, guard = stormed[0]
        return (
            f"{describe_frame(code)} kept recompiling (guards failed {count}×, last: {explain_guard(guard)})"
        )

    def record(
        self, cell: int | None, key: str, error: BaseException | None, stormed: bool = False
    ) -> CompiledCell:
        counters, breaks = _counters(), _breaks()
        delta = {name: counters[name] - self._counters[name] for name in counters}
        graphs = self._graph_counter()
        return CompiledCell(
            cell=cell,
            key=key,
            graphs=delta["graphs"] if graphs is None or self._graphs is None else graphs - self._graphs,
            frames=delta["frames"],
            graph_breaks=_new_breaks(self._breaks, breaks),
            recompile_reasons=self._recompile_reasons(),
            storm=self._storm() if stormed else None,
            fx_cache_hits=delta["fx_cache_hits"],
            fx_cache_misses=delta["fx_cache_misses"],
            wall_ms=(time.perf_counter() - self._started) * 1000,
            error=type(error).__name__ if error is not None else None,
            waited_ms=self._waited_s * 1000,
        )


class StormWatch:
    """Counts recompiles per cell or function and warns once when they pile up."""

    def __init__(self) -> None:
        self._recompiles: dict[str, int] = {}
        self._warned: set[str] = set()

    def observe(self, key: str, record: CompiledCell, what: str) -> None:
        if not record.recompile_reasons:
            return
        count = self._recompiles[key] = self._recompiles.get(key, 0) + 1  # one recompile per run
        if count > STORM_RECOMPILES and key not in self._warned:
            self._warned.add(key)
            warnings.warn(
                f"tpunb compile: {what} has recompiled {count} times; last because "
                f"{record.recompile_reasons[0]}. Give it fixed shapes: pad or bucket inputs, "
                "DataLoader(drop_last=True), or mark the dimension dynamic: "
                "torch._dynamo.mark_dynamic(tensor, 0)",
                RuntimeWarning,
                stacklevel=4,
            )


class CellCompiler:
    """Compiles and runs cells; keeps one compiled function per cell text.

    A cell first waits for fused groups still compiling in the background (``wait``), and
    its record says how long: Dynamo would otherwise wait for the same compiles, unseen,
    inside the cell's first compile."""

    def __init__(
        self,
        compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]],
        publish: Any,
        graph_counter: GraphCounter = _no_graph_counter,
        wait: BackgroundWait = _nothing_to_wait_for,
    ) -> None:
        self._compile = compile_fn
        self._publish = publish
        self._graph_counter = graph_counter
        self._wait = wait
        self._compiled: dict[str, tuple[Callable[[], Any], Callable[[], Any], list[str]]] = {}
        self.storms = StormWatch()
        self._scripts = ScriptCode()

    def run(
        self, tree: ast.Module, source: str, filename: str, namespace: dict[str, Any], cell: int | None
    ) -> Any:
        __tracebackhide__ = True
        from torch._dynamo.exc import TorchRuntimeError

        key = hashlib.sha1(f"{id(namespace)}\0{source}".encode()).hexdigest()[:12]
        entry = self._compiled.get(key)
        if entry is None:
            function, names = cell_function(tree, filename, namespace)
            entry = self._compiled[key] = (self._compile(function), function, names)
        compiled, plain, names = entry
        placeholders = [name for name in names if name not in namespace]
        for name in placeholders:
            namespace[name] = UNASSIGNED
        watch = CompileWatch(plain.__code__, self._graph_counter, self._wait(), every_frame=True)
        stopper = StormStopper()
        error: BaseException | None = None
        try:
            try:
                _skip_ipython()
                with stopper.watching(), self._scripts.serving():
                    return compiled()
            except TorchRuntimeError:
                # The cell's own error, met while tracing (shapes, dtypes): run it as Python to
                # raise the real exception at the cell's line.
                return plain()
        except BaseException as failure:
            error = failure
            raise
        finally:
            for name in placeholders:
                if namespace.get(name) is UNASSIGNED:
                    del namespace[name]
            record = watch.record(cell, key, error, stormed=stopper.stopped)
            self._publish(record)
            self.storms.observe(key, record, f"cell In[{cell}]")


def _skip_ipython() -> None:
    """Dynamo runs IPython's own code (a ``%run`` or ``%time`` line of the cell) as Python
    rather than tracing into it: tracing it compiles nothing useful and warns about
    ``sys._getframe``. The frames the magic runs (a ``%run`` script's) are still compiled."""
    from torch._dynamo import trace_rules

    if not any(skipped.rstrip(os.sep).endswith(os.sep + "IPython") for skipped in trace_rules.SKIP_DIRS):
        trace_rules.add("IPython")


def compile_callable(
    target: Any,
    compile_fn: Callable[..., Callable[..., Any]],
    publish: Any,
    graph_counter: GraphCounter = _no_graph_counter,
    **options: Any,
) -> Callable[..., Any]:
    """``tpunb.compile``: ``torch.compile`` with tpunb's reporting. A call publishes a record
    only when something was compiled or recompiled, so a warm training step pays a counter read."""
    compiled = compile_fn(target, **options)
    function = target.forward if isinstance(target, _module_type()) else target
    code = getattr(function, "__code__", None)
    name = getattr(function, "__qualname__", type(target).__name__)
    storms = StormWatch()

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        watch = CompileWatch(code, graph_counter) if code is not None else None
        error: BaseException | None = None
        try:
            return compiled(*args, **kwargs)
        except BaseException as failure:
            error = failure
            raise
        finally:
            if watch is not None:
                record = watch.record(None, name, error)
                if record.graphs or record.recompile_reasons or record.graph_breaks:
                    publish(record)
                    storms.observe(name, record, name)

    return run


def _module_type() -> type:
    import torch

    return torch.nn.Module


class CompileModePrefix:
    """An IPython cleanup transformer: with compile as the default mode, a cell becomes
    ``%%tpu_mode compile`` + the cell, unless it starts with a magic or a shell escape.

    Suspended while ``%%tpu_mode`` transforms its own body, which must not be wrapped again.
    """

    def __init__(self, default_mode: Callable[[], str]) -> None:
        self._default_mode = default_mode
        self._suspended = False

    def __call__(self, lines: list[str]) -> list[str]:
        if self._suspended or self._default_mode() != "compile":
            return lines
        first = next((line.strip() for line in lines if line.strip()), "")
        if not first or first.startswith(("%", "!")):
            return lines
        return ["%%tpu_mode compile\n", *lines]

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        previous, self._suspended = self._suspended, True
        try:
            yield
        finally:
            self._suspended = previous
