"""A cell that failed on the device, told in the user's terms: what ran out or broke, what was
lost with it, which cells make it again.

XLA-based runtimes (TorchTPU, PyTorch/XLA) report an out-of-memory as compiler text
(``CompileTimeHbmOom: ... required for HLO temporaries (20.00G) exceeds available HBM
(15.75G)``; at run time ``Attempting to allocate 1.00G. That was not possible. There are
765.65M free``). A computation that fails leaves every tensor it was to write in a failed
state (a model's parameters after a failed optimizer step), and each later use of one fails
with ``a required argument is in a failed state``, in whatever cell it happens. This module
reads those texts, finds the user's variables that hold lost values, and names the cells
that define them; the runtime supplies what only it can check (``is_lost``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The text of a use of a value whose computation failed earlier (TorchTPU).
FAILED_STATE = "a required argument is in a failed state"

_COMPILE_OOM = re.compile(
    r"required for HLO temporaries \((?P<need>[\d.]+\s*[KMGT]?i?B?)\) exceeds available HBM "
    r"\((?P<have>[\d.]+\s*[KMGT]?i?B?)\)"
)
_RUNTIME_OOM = re.compile(
    r"Attempting to allocate (?P<need>[\d.]+\s*[KMGT]?i?B?)\. That was not possible\. "
    r"There are (?P<free>[\d.]+\s*[KMGT]?i?B?) free"
)
_ANY_OOM = ("ran out of memory", "RESOURCE_EXHAUSTED", "Ran out of memory")
_COMPILE_FAILED = "failed to compile MLIR module"

#: What to try when a step does not fit, in the order most people should.
OOM_ADVICE = "try a smaller batch, %tpu_precision bf16, or torch.utils.checkpoint around the largest blocks"


@dataclass(frozen=True)
class Failure:
    """A device failure as the user should read it: ``kind`` is "out of memory", "a failed
    computation" (a value lost earlier was used) or "a computation the device could not
    compile"; ``detail`` says what the figures were."""

    kind: str
    detail: str = ""

    @property
    def out_of_memory(self) -> bool:
        return self.kind == "out of memory"


def classify(error: BaseException) -> Failure | None:
    """The device failure behind ``error``, or None when it is the user's own error."""
    text = str(error)
    if FAILED_STATE in text:
        return Failure("a failed computation")
    need = _COMPILE_OOM.search(text)
    if need is not None:
        return Failure(
            "out of memory", f"it needs {need['need']} for its temporaries; the chip has {need['have']}"
        )
    need = _RUNTIME_OOM.search(text)
    if need is not None:
        return Failure("out of memory", f"it needed {need['need']} more while {need['free']} were free")
    if any(marker in text for marker in _ANY_OOM):
        return Failure("out of memory")
    if _COMPILE_FAILED in text:
        return Failure("a computation the device could not compile")
    return None


@dataclass
class Lost:
    """The user's variables holding values lost with a failed computation."""

    names: dict[str, int] = field(default_factory=dict)  # variable -> tensors lost in it

    def __bool__(self) -> bool:
        return bool(self.names)

    def words(self) -> str:
        return ", ".join(
            f"{name} ({count} tensor{'s' if count != 1 else ''})" for name, count in self.names.items()
        )


def tensors_in(value: Any) -> Iterable[Any]:
    """The tensors a notebook variable holds where a failed step writes: itself, a module's
    parameters, buffers and gradients, an optimizer's state."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
        if value.grad is not None and value.is_leaf:
            yield value.grad
    elif isinstance(value, torch.nn.Module):
        for tensor in (*value.parameters(), *value.buffers()):
            yield tensor
            if tensor.grad is not None:
                yield tensor.grad
    elif isinstance(value, torch.optim.Optimizer):
        for state in value.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def find_lost(namespace: Mapping[str, Any], is_lost: Callable[[Any], bool], device_type: str) -> Lost:
    """The namespace's variables (not ``_``-prefixed) whose tensors on ``device_type`` are lost."""
    lost = Lost()
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        count = sum(1 for t in tensors_in(value) if t.device.type == device_type and is_lost(t))
        if count:
            lost.names[name] = count
    return lost


def defining_cells(names: Iterable[str], history: Sequence[str]) -> dict[int, list[str]]:
    """For each name, the last cell of ``history`` (IPython's ``In``) that assigns it at top
    level: cell number -> the names it makes again."""
    wanted, found = set(names), {}
    for number in range(len(history) - 1, 0, -1):
        for name in wanted - found.keys():
            if name in _assigned(history[number]):
                found[name] = number
    cells: dict[int, list[str]] = {}
    for name, number in sorted(found.items(), key=lambda item: item[1]):
        cells.setdefault(number, []).append(name)
    return cells


def _assigned(source: str) -> set[str]:
    """Names a cell's code stores; a cell magic's body (``In`` holds it as the string argument
    of ``get_ipython().run_cell_magic(...)``) counts as the cell's code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run_cell_magic"
            and len(node.args) == 3
            and isinstance(node.args[2], ast.Constant)
            and isinstance(node.args[2].value, str)
        ):
            names |= _assigned(node.args[2].value)
    return names


def remake_advice(lost: Lost, history: Sequence[str] | None, current: int | None) -> str:
    """``. Re-create them: run In[3] (model, opt) again``; nothing for values the failing cell
    ``current`` made itself (its own code is what to change); a plain instruction without
    history."""
    cells = defining_cells(lost.names, history) if history else {}
    cells.pop(current, None)
    if cells:
        runs = "; ".join(f"In[{number}] ({', '.join(names)})" for number, names in cells.items())
        return f". Re-create them: run {runs} again"
    made_here = bool(history) and current is not None and set(lost.names) <= _assigned(history[current])
    return "" if made_here else ". Re-create them (run the cells that made them again), or restart the kernel"
