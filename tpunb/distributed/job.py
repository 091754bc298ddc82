"""A distributed cell as a job: its code, and the notebook state it uses, in a form the
worker processes can load.

Which state: the names the cell reads (anywhere in it, nested functions included) that the
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


def names_read(source: str) -> set[str]:
    """Every name the cell reads (loads), in any scope of it."""
    tree = ast.parse(source)
    return {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


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
    wanted = sorted(n for n in names_read(source) if n in namespace and n not in SHELL_NAMES)
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
