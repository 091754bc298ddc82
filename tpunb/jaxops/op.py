"""``@tpunb.jax_op``: a function written with ``jax.numpy`` (or a Pallas kernel) as a PyTorch op.

Each decorated function becomes two ``torch.library`` custom ops in the ``tpunb_jax``
namespace: the forward and its vector-Jacobian product. Being real ops is what lets every
mode treat them like any other op, with no special cases beyond one line in the fused
engine:

* strict: the op runs at once (JAX compiles it on first use, then hits its jit cache);
* debug: debug mode's dispatch checks see ``tpunb_jax.NAME`` and check its outputs for a
  new NaN/Inf, naming the op and the user's line;
* fused: the engine flushes what is pending and runs the op on its own (a clean boundary:
  JAX compiles its own graph), and the op reports itself to the monitor as a group with
  JAX's compile time, or as a cache hit;
* compile: ``torch.compile`` sees an op with a fake (shape) implementation, from
  ``jax.eval_shape``, and calls it from the compiled graph.

Runtimes: on the native runtime JAX runs the op on the tensors' memory (``bridge``); on
PyTorch/XLA it joins the lazy graph (``xla_bridge``), so there it is part of the fused
group rather than a boundary; on TorchTPU it is handed to ``torch.tpu.pallas.jax_op``
(``torchtpu_bridge``), which runs it on the chip.

Autograd: the backward is the second op, which runs ``jax.vjp`` of the same function
(recomputing the forward inside one JAX graph, so nothing JAX-side is kept between the two),
so a JAX op can sit inside a model trained by a PyTorch optimizer.

Arguments: torch tensors are the op's inputs (positional or keyword); every other argument
is static, baked into the compiled JAX function, and must be hashable (a float scale, an
axis). Floating tensors get gradients; integer ones do not.
"""

from __future__ import annotations

import functools
import itertools
import re
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tpunb.jaxops.bridge import require_jax, to_jax, to_torch
from tpunb.jaxops.compile_watch import watch_compiles
from tpunb.jaxops.hints import Hint, Hints, JaxOpError, check_outputs
from tpunb.jaxops.report import report_call
from tpunb.jaxops.torchtpu_bridge import TorchTpuOps, on_tpu
from tpunb.jaxops.xla_bridge import call_on_xla, on_xla

NAMESPACE = "tpunb_jax"
_names = itertools.count()
_taken: set[str] = set()


@dataclass(frozen=True)
class CallShape:
    """Where the tensors sit among the arguments, and the static values around them."""

    positional: tuple[Any, ...]  # a static value, or TENSOR
    keywords: tuple[tuple[str, Any], ...]

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a function of the tensor arguments only, statics filled in."""
        positional, keywords = self.positional, self.keywords

        def call(*arrays: Any) -> Any:
            supply = iter(arrays)
            args = [next(supply) if a is TENSOR else a for a in positional]
            kwargs = {k: next(supply) if v is TENSOR else v for k, v in keywords}
            return fn(*args, **kwargs)

        return call


TENSOR = object()  # marks a tensor's place in a CallShape


@dataclass
class Variant:
    """One static configuration of the op: its jitted forward and VJP."""

    forward: Callable[..., Any]
    vjp: Callable[..., Any]
    traced: dict[tuple, tuple[Any, list[Hint]]] = field(default_factory=dict)  # by input shapes


def _split(args: tuple, kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], CallShape]:
    tensors: list[torch.Tensor] = []

    def take(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return TENSOR
        if not isinstance(value, Hashable):
            raise JaxOpError(
                f"jax op arguments are torch tensors or hashable static values (baked into the "
                f"compiled function); got a {type(value).__name__}"
            )
        return value

    shape = CallShape(tuple(take(a) for a in args), tuple((k, take(v)) for k, v in sorted(kwargs.items())))
    return tensors, shape


def _jax_dtype(dtype: torch.dtype) -> Any:
    return require_jax().numpy.dtype(str(dtype).removeprefix("torch."))


def _torch_dtype(dtype: Any) -> torch.dtype:
    return getattr(torch, require_jax().numpy.dtype(dtype).name)


def _differentiable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


class JaxOp:
    """A JAX function callable on torch tensors; see the module docstring."""

    def __init__(self, fn: Callable[..., Any], out: Hints = None, name: str | None = None) -> None:
        require_jax()
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.hints = out
        self.name = _unique_name(name or getattr(fn, "__name__", "jax_op"))
        self._variants: list[Variant] = []
        self._variant_of: dict[CallShape, int] = {}
        self._forward_op = _register(self)
        self._torchtpu = TorchTpuOps(self.name)
        # torch.compile sees one call (run on fake tensors: shapes from jax.eval_shape), not
        # the JAX tracing inside, which it cannot follow
        torch.compiler.allow_in_graph(self)

    def __repr__(self) -> str:
        return f"<tpunb.jax_op {NAMESPACE}.{self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors, shape = _split(args, kwargs)
        if not tensors:
            raise JaxOpError(f"jax op {self.name} needs at least one torch tensor argument")
        index = self._variant_index(shape)
        treedef, traced = self._trace(index, tensors)
        check_outputs(self.name, self.hints, tensors, traced)
        outputs = self._forward_op(tensors, index)
        return treedef.unflatten(outputs)

    # --- the compiled JAX functions -------------------------------------------------------

    def _variant_index(self, shape: CallShape) -> int:
        index = self._variant_of.get(shape)
        if index is None:
            jax = require_jax()
            call = shape.bind(self.fn)
            self._variants.append(Variant(forward=jax.jit(call), vjp=jax.jit(_pullback(call))))
            index = self._variant_of[shape] = len(self._variants) - 1
        return index

    def _trace(self, index: int, tensors: Sequence[torch.Tensor]) -> tuple[Any, list[Hint]]:
        """The output structure and (shape, dtype)s for these inputs (``jax.eval_shape``)."""
        variant = self._variants[index]
        # int() pins symbolic sizes (torch.compile's dynamic shapes) to this call's values, a
        # guard: JAX compiles one program per shape anyway, and traces concrete shapes only
        key = tuple((tuple(int(d) for d in t.shape), t.dtype) for t in tensors)
        found = variant.traced.get(key)
        if found is None:
            jax = require_jax()
            specs = [jax.ShapeDtypeStruct(shape, _jax_dtype(dtype)) for shape, dtype in key]
            leaves, treedef = jax.tree_util.tree_flatten(jax.eval_shape(variant.forward, *specs))
            found = variant.traced[key] = (treedef, [(tuple(a.shape), _torch_dtype(a.dtype)) for a in leaves])
        return found

    # --- what the custom ops run ----------------------------------------------------------

    def run_forward(self, tensors: list[torch.Tensor], index: int) -> list[torch.Tensor]:
        forward = self._variants[index].forward
        if on_xla(tensors):
            return call_on_xla(forward, tuple(tensors))
        if on_tpu(tensors):
            return self._torchtpu.call(index, "fwd", forward, tensors)
        return self._run(lambda arrays: forward(*arrays), tensors, index, backward=False)

    def run_vjp(
        self, tensors: list[torch.Tensor], cotangents: list[torch.Tensor], index: int
    ) -> list[torch.Tensor]:
        vjp = self._variants[index].vjp
        if on_xla(tensors):
            return call_on_xla(vjp, (tuple(tensors), tuple(cotangents)))
        if on_tpu(tensors):
            count = len(tensors)
            return self._torchtpu.call(
                index, "vjp", lambda *xs: vjp(xs[:count], xs[count:]), [*tensors, *cotangents]
            )
        return self._run(
            lambda arrays: vjp(tuple(arrays), tuple(to_jax(c) for c in cotangents)),
            tensors,
            index,
            backward=True,
        )

    def fake_forward(self, tensors: list[torch.Tensor], index: int) -> list[torch.Tensor]:
        _, traced = self._trace(index, tensors)
        return [torch.empty(shape, dtype=dtype, device=tensors[0].device) for shape, dtype in traced]

    def _run(  # the native runtime: JAX runs the op on its own, on the tensors' memory
        self, call: Callable[[list[Any]], Any], tensors: list[torch.Tensor], index: int, *, backward: bool
    ) -> list[torch.Tensor]:
        jax = require_jax()
        device = tensors[0].device
        started = time.perf_counter()
        with watch_compiles() as tally:
            result = call([to_jax(t) for t in tensors])
            # the inputs' memory is JAX's to read until the op is done: wait, then hand over
            leaves = jax.block_until_ready(jax.tree_util.tree_leaves(result))
        outputs = [_not_an_input(to_torch(leaf, device), tensors) for leaf in leaves]
        report_call(
            name=f"{self.name} (backward)" if backward else self.name,
            key=f"jax:{self.name}:{index}:{'vjp' if backward else 'fwd'}",
            tensors=tensors,
            compiles=tally.compiles,
            compile_s=tally.seconds,
            run_s=time.perf_counter() - started - tally.seconds,
        )
        return outputs


def _pullback(call: Callable[..., Any]) -> Callable[..., Any]:
    """``(primals, cotangents) -> gradients of the floating primals``, for ``jax.jit``."""

    def pullback(primals: tuple, cotangents: tuple) -> list[Any]:
        jax = require_jax()
        inexact = [i for i, p in enumerate(primals) if jax.numpy.issubdtype(p.dtype, jax.numpy.inexact)]

        def of_inexact(*values: Any) -> Any:
            args = list(primals)
            for i, value in zip(inexact, values, strict=True):
                args[i] = value
            return call(*args)

        out, pull = jax.vjp(of_inexact, *(primals[i] for i in inexact))
        structure = jax.tree_util.tree_structure(out)
        return list(pull(jax.tree_util.tree_unflatten(structure, list(cotangents))))

    return pullback


def _not_an_input(output: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A custom op may not return its input's memory (JAX can pass an input through)."""
    if any(output.data_ptr() == t.data_ptr() and t.numel() for t in inputs):
        return output.clone()
    return output


def _unique_name(wanted: str) -> str:
    """An op name torch.library does not have yet: re-running a notebook cell that defines
    the op registers ``gelu_2`` instead of failing on ``gelu``."""
    base = re.sub(r"\W", "_", wanted).strip("_") or "jax_op"
    name = base
    while name in _taken:
        name = f"{base}_{next(_names) + 2}"
    _taken.add(name)
    return name


def _register(op: JaxOp) -> Any:
    """The forward custom op, with its fake kernel and its autograd formula (which calls the
    VJP custom op, registered here too)."""
    forward = torch.library.custom_op(
        f"{NAMESPACE}::{op.name}",
        op.run_forward,
        mutates_args=(),
        schema="(Tensor[] inputs, int variant) -> Tensor[]",
    )
    vjp = torch.library.custom_op(
        f"{NAMESPACE}::{op.name}_vjp",
        op.run_vjp,
        mutates_args=(),
        schema="(Tensor[] inputs, Tensor[] cotangents, int variant) -> Tensor[]",
    )
    forward.register_fake(op.fake_forward)

    @vjp.register_fake
    def _(inputs: list[torch.Tensor], cotangents: list[torch.Tensor], variant: int) -> list[torch.Tensor]:
        return [torch.empty_like(t) for t in inputs if _differentiable(t)]

    def setup_context(ctx: Any, inputs: tuple, output: list[torch.Tensor]) -> None:
        tensors, variant = inputs
        ctx.variant = variant
        ctx.outputs = [(o.shape, o.dtype) for o in output]
        ctx.save_for_backward(*tensors)

    def backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[list[torch.Tensor | None], None]:
        tensors = list(ctx.saved_tensors)
        cotangents = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=tensors[0].device)
            for g, (shape, dtype) in zip(grads, ctx.outputs, strict=True)
        ]
        computed = iter(vjp(tensors, cotangents, ctx.variant))
        return [next(computed) if _differentiable(t) else None for t in tensors], None

    forward.register_autograd(backward, setup_context=setup_context)
    return forward


def jax_op(fn: Callable[..., Any] | None = None, *, out: Hints = None, name: str | None = None) -> Any:
    """Turn a JAX function into a callable on torch tensors, with autograd.

    ``@tpunb.jax_op`` or ``@tpunb.jax_op(out=((n, d), torch.float32), name="gelu")``. ``out``
    hints the result: checked when JAX traces the op, so a wrong shape or dtype raises
    (naming the op and your line) before anything runs. See ``tpunb.jaxops.op``.
    """
    if fn is None:
        return lambda f: JaxOp(f, out=out, name=name)
    return JaxOp(fn, out=out, name=name)
