"""A distributed cell as a job: its code, and the notebook state it uses, in a form the
worker processes can load.

Which state: the names the cell reads before it assigns them (``free_names``) that the
notebook defines. Modules are sent as imports (``import torch.nn.functional as F`` becomes
"F is torch.nn.functional"); everything else is pickled by value with cloudpickle, so the
notebook's own functions and classes travel too. A value that cannot be pickled (an open
file, a DataLoader with worker threads) is refused by name, before any process starts.
"""

from __future__ import annotations

import ast
import builtins
import types
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

#: IPython's own names in a notebook namespace, never sent.
SHELL_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})


class UnpicklableVariables(ValueError):
    """Variables the cell uses that cannot be sent to the workers."""


@dataclass(frozen=True)
class Job:
    source: str  # the cell body, preceded by one blank line per line above it in the cell
    filename: str  # what tracebacks call the cell: "Cell In[7]"
    variables: bytes  # cloudpickle of {name: value}
    imports: tuple[tuple[str, str], ...]  # (name in the cell, module)
    mode: str  # the notebook's tpunb mode, applied in every worker
    backend: str
    returns: tuple[str, ...]
    sent: tuple[str, ...] = field(default=())  # what was sent, for the one-line report


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stores(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def free_names(source: str) -> set[str]:
    """The names the cell may read before it assigns them: those come from the notebook.

    Statements are followed in order; a name assigned by an earlier statement of the same
    flow is the cell's own. Assignments inside a branch, a loop or a ``try`` do not count
    after it (the branch may not run), and a function body's reads count where the function
    is defined. Conservative: it may send a name the cell did not need, never miss one.
    """
    free: set[str] = set()

    def visit(statements: list[ast.stmt], bound: set[str]) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                free.update(_loads(stmt) - bound)
                bound.add(stmt.name)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in stmt.names)
            elif isinstance(stmt, ast.For | ast.AsyncFor):
                free.update(_loads(stmt.iter) - bound)
                visit(stmt.body, bound | _stores(stmt.target))
                visit(stmt.orelse, set(bound))
            elif isinstance(stmt, ast.While | ast.If):
                free.update(_loads(stmt.test) - bound)
                visit(stmt.body, set(bound))
                visit(stmt.orelse, set(bound))
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    free.update(_loads(item.context_expr) - bound)
                    if item.optional_vars is not None:
                        bound.update(_stores(item.optional_vars))
                visit(stmt.body, bound)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body, set(bound))
                for handler in stmt.handlers:
                    free.update(_loads(handler.type) - bound if handler.type else set())
                    visit(handler.body, bound | ({handler.name} if handler.name else set()))
                visit(stmt.orelse, set(bound))
                visit(stmt.finalbody, set(bound))
            else:  # a simple statement: its reads happen before its assignments
                free.update(_loads(stmt) - bound)
                bound.update(_stores(stmt))

    visit(ast.parse(source).body, set())
    return free


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    return f"{kind}{list(shape)}" if shape is not None and not callable(shape) else kind


def _unpicklable(values: dict[str, Any]) -> UnpicklableVariables:
    """Which of ``values`` cannot be pickled, and why, as one error."""
    refused = {}
    for name, value in values.items():
        try:
            cloudpickle.dumps(value)
        except Exception as error:
            refused[name] = f"{_describe(value)}: {type(error).__name__}: {error}"
    lines = "\n".join(f"  {name} ({why})" for name, why in refused.items())
    return UnpicklableVariables(
        "%%tpu_distributed: these variables cannot be sent to the workers:\n"
        f"{lines}\nCreate them inside the cell instead, or stop using them there."
    )


def build_job(
    source: str,
    namespace: dict[str, Any],
    *,
    first_line: int,
    filename: str,
    mode: str,
    backend: str,
    returns: tuple[str, ...],
) -> Job:
    """The job for a cell whose body starts on line ``first_line`` of the notebook cell."""
    wanted = sorted(n for n in free_names(source) if n in namespace and n not in SHELL_NAMES)
    wanted = [n for n in wanted if not (n.startswith("_") or getattr(builtins, n, None) is namespace[n])]
    imports = tuple((n, namespace[n].__name__) for n in wanted if isinstance(namespace[n], types.ModuleType))
    values = {n: namespace[n] for n in wanted if not isinstance(namespace[n], types.ModuleType)}
    try:
        payload = cloudpickle.dumps(values)
    except Exception:
        raise _unpicklable(values) from None
    sent = tuple(f"{n} ({_describe(v)})" for n, v in values.items()) + tuple(
        f"{n} (module {m})" for n, m in imports
    )
    return Job(
        source="\n" * (first_line - 1) + source,
        filename=filename,
        variables=payload,
        imports=imports,
        mode=mode,
        backend=backend,
        returns=returns,
        sent=sent,
    )
