"""The backward of a hot training call (hotcalls.py) runs as its forward ran: on plain
tensors, outside the engine's recording.

Its forward ran compiled with the engine's dispatch mode off the stack; its backward is
AOTAutograd's compiled backward, which reads the memory of the gradients it is given. The
autograd engine, though, runs each node under the mode stack that ``backward()`` was called
with, and inside a fused scope that holds the engine's mode whenever the hot call was not
the outermost one (a PEFT wrapper around a model already compiled whole for generation).
Then what reaches the compiled backward is the engine's wrappers: a gradient computed from a
recorded loss, and the zeros autograd makes for outputs nothing used (a model's key/value
cache), which AOTAutograd rejects ("a tensor subclass where we guessed its metadata
incorrectly") and which, let through, are memory its kernels cannot read.

So each autograd node the call created gets a pre-hook: gradients arriving at it are
materialized, and it takes the engine's mode off the stack for its own run. That lasts one
node: the autograd engine restores the mode stack it was called with before it runs the
next one, so the rest of the backward is recorded as before. A call compiled whole made one
node, behind all its outputs: one hook (the graph's parameters' nodes are not walked).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode

from tpunb.fuse.recording.deferred import DeferredTensor

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine


def next_node_number() -> int:
    """The sequence number the next autograd node made on this thread gets: taken before and
    after a hot call, it tells the call's own nodes from all others."""
    return torch._C._autograd._get_sequence_nr()


def backward_as_forward(engine: HotPathEngine, out: Any, made: range) -> None:
    """Arrange that the backward of the call that returned ``out`` (it made the autograd nodes
    numbered ``made``) gets plain gradients and runs outside ``engine``'s mode."""

    def outside_recording(grads: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if any(type(grad) is DeferredTensor for grad in grads):
            grads = tuple(
                engine.materialize(grad, "a hot call's gradient") if type(grad) is DeferredTensor else grad
                for grad in grads
            )
        else:
            grads = None
        if getattr(_get_current_dispatch_mode(), "engine", None) is engine:
            _pop_mode()  # for this node's run only: the autograd engine restores the stack
        return grads

    outputs = [tensor for tensor in _tensors_in(out) if tensor.requires_grad]
    for node in _nodes_made(outputs, made):
        node.register_prehook(outside_recording)


def _nodes_made(outputs: list[torch.Tensor], made: range) -> Iterator[Any]:
    """The autograd nodes behind ``outputs`` numbered in ``made``: those the call made (its
    compiled function's, and eager ones between graph breaks). Once all are found, the walk
    stops: for a call compiled whole, at the outputs' node."""
    seen: set[int] = set()
    todo = [tensor.grad_fn for tensor in outputs]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or node._sequence_nr() not in made:
            continue
        seen.add(id(node))
        yield node
        if len(seen) == len(made):
            return
        todo.extend(following for following, _ in node.next_functions)


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict) or (hasattr(value, "values") and callable(value.values)):
        for item in value.values():
            yield from _tensors_in(item)
