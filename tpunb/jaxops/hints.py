"""Output hints of a JAX op: what the user says it returns, checked against what JAX traces.

A hint is ``(shape, dtype)`` (a ``None`` in the shape matches any size), a list of them for
several outputs, or a callable that gets the op's torch tensor arguments and returns those.
A wrong hint is caught when JAX traces the op, before anything runs, and the error names
the op, the output and the user's line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tpunb.source import locate

Shape = Sequence[int | None]
Hint = tuple[Shape, torch.dtype]
Hints = Hint | Sequence[Hint] | Callable[..., Any] | None


class JaxOpError(TypeError):
    """A JAX op's arguments or results do not match what it promised."""


def describe(shape: Sequence[Any], dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')}[{', '.join('*' if d is None else str(d) for d in shape)}]"


def _as_list(hints: Any) -> list[Hint]:
    if isinstance(hints, tuple) and len(hints) == 2 and isinstance(hints[1], torch.dtype):
        return [hints]
    listed = list(hints)
    if not all(isinstance(h, tuple) and len(h) == 2 and isinstance(h[1], torch.dtype) for h in listed):
        raise JaxOpError(
            f"out= takes (shape, torch dtype), a list of them, or a function returning them; got {hints!r}"
        )
    return listed


def check_outputs(op: str, hints: Hints, tensors: Sequence[torch.Tensor], traced: list[Hint]) -> None:
    """Raise if JAX's traced outputs differ from the hints (no hints: nothing to check)."""
    if hints is None:
        return
    promised = _as_list(hints(*tensors) if callable(hints) else hints)
    where = locate()
    at = f" (at {where})" if where else ""
    if len(promised) != len(traced):
        raise JaxOpError(f"jax op {op} returns {len(traced)} outputs, but out= describes {len(promised)}{at}")
    for index, ((shape, dtype), (want_shape, want_dtype)) in enumerate(zip(traced, promised, strict=True)):
        fits = len(shape) == len(want_shape) and all(
            w is None or w == d for d, w in zip(shape, want_shape, strict=False)
        )
        if not fits or dtype != want_dtype:
            raise JaxOpError(
                f"jax op {op}: output {index} is {describe(shape, dtype)}, "
                f"but out= says {describe(want_shape, want_dtype)}{at}"
            )
