"""From a recorded group to a compiled one: an FX graph of its encoded ops (see trace.py),
compiled by Inductor.

Python floats that vary between flushes (Adam's bias corrections, LR schedules) are
*lifted*: read from one float64 vector input and fed to the Tensor overload of their op, so
one compiled graph serves every step. (The group's other way to run, its ops replayed one by
one, is the flush stage's: flush.py.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from tpunb.fuse.groups.disk_cache import rebuild_torn_binaries
from tpunb.fuse.recording.meta import SIZED_WHEN_RUN
from tpunb.fuse.recording.random_fill import FILLS, RANDOM_FILL, is_fresh_fill
from tpunb.fuse.recording.trace import Node, OpRecord, Ref, decoder, resolve

aten = torch.ops.aten

# --- lifting varying floats -----------------------------------------------------------------

Rewrite = Callable[[fx.Graph, list, dict, fx.Node], fx.Node]


def _call(graph: fx.Graph, func: Any, *args: Any, **kwargs: Any) -> fx.Node:
    return graph.call_function(func, tuple(args), kwargs)


def _substitute(func: Any, position: int) -> Rewrite:
    """The float at ``position`` becomes the 0-dim tensor, under ``func`` (a Tensor overload)."""

    def rewrite(graph, args, kwargs, scalar):
        args = list(args)
        args[position] = scalar
        return _call(graph, func, *args, **kwargs)

    return rewrite


def _alpha(add_like: Any) -> Rewrite:
    """``add(x, y, alpha=a)`` -> ``add(x, mul(y, a))``."""

    def rewrite(graph, args, kwargs, scalar):
        rest = {k: v for k, v in kwargs.items() if k != "alpha"}
        scaled = _call(graph, aten.mul.Tensor, args[1], scalar)
        return _call(graph, add_like, args[0], scaled, **rest)

    return rewrite


def _addc(add: Any, combine: Any) -> Rewrite:
    """``addcdiv(x, a, b, value=v)`` -> ``add(x, div(mul(a, v), b))`` (addcmul: ``mul``)."""

    def rewrite(graph, args, kwargs, scalar):
        scaled = _call(graph, aten.mul.Tensor, args[1], scalar)
        return _call(graph, add, args[0], _call(graph, combine, scaled, args[2]))

    return rewrite


LIFT_RULES: dict[tuple[Any, int | str], Rewrite] = {}
for _name in ("add", "sub", "mul", "div"):
    for _suffix in ("", "_"):
        _tensor = getattr(aten, _name + _suffix).Tensor
        LIFT_RULES[(_tensor, 1)] = _substitute(_tensor, 1)
        LIFT_RULES[(getattr(aten, _name + _suffix).Scalar, 1)] = _substitute(_tensor, 1)
        if _name in ("add", "sub"):
            LIFT_RULES[(_tensor, "alpha")] = _alpha(_tensor)
LIFT_RULES.update(
    {
        (aten.addcdiv.default, "value"): _addc(aten.add.Tensor, aten.div.Tensor),
        (aten.addcdiv_.default, "value"): _addc(aten.add_.Tensor, aten.div.Tensor),
        (aten.addcmul.default, "value"): _addc(aten.add.Tensor, aten.mul.Tensor),
        (aten.addcmul_.default, "value"): _addc(aten.add_.Tensor, aten.mul.Tensor),
        (aten.lerp.Scalar, 2): _substitute(aten.lerp.Tensor, 2),
        (aten.lerp_.Scalar, 2): _substitute(aten.lerp_.Tensor, 2),
        (aten.pow.Tensor_Scalar, 1): _substitute(aten.pow.Tensor_Tensor, 1),
        (aten.fill_.Scalar, 1): _substitute(aten.fill_.Tensor, 1),
        (aten.fill.Scalar, 1): _substitute(aten.fill.Tensor, 1),
    }
)


def _foreach(per_tensor: Rewrite) -> Rewrite:
    """A foreach op (``_foreach_div_(tensors, scalars)``) as one ``per_tensor`` rewrite per list
    element, each with its own scalar (a ScalarList) or the one scalar (a Scalar). Optimizers'
    foreach paths take per-step floats (Adam's bias corrections) this way."""

    def rewrite(graph, args, kwargs, scalar):
        nodes = []
        for k in range(len(args[0])):
            element = [a[k] if isinstance(a, list) else a for a in args]
            own = scalar[k] if isinstance(scalar, list) else scalar
            nodes.append(per_tensor(graph, element, kwargs, own))
        return nodes

    return rewrite


for _name in ("add", "sub", "mul", "div"):
    for _suffix in ("", "_"):
        _packet = getattr(aten, f"_foreach_{_name}{_suffix}")
        _per_tensor = _substitute(getattr(aten, _name + _suffix).Tensor, 1)
        LIFT_RULES[(_packet.ScalarList, 1)] = _foreach(_per_tensor)
        LIFT_RULES[(_packet.Scalar, 1)] = _foreach(_per_tensor)
        if _name in ("add", "sub"):
            LIFT_RULES[(_packet.List, "alpha")] = _foreach(_alpha(getattr(aten, _name + _suffix).Tensor))
for _name, _combine in (("addcdiv", aten.div.Tensor), ("addcmul", aten.mul.Tensor)):
    for _suffix, _add in (("", aten.add.Tensor), ("_", aten.add_.Tensor)):
        _packet = getattr(aten, f"_foreach_{_name}{_suffix}")
        LIFT_RULES[(_packet.ScalarList, 3)] = _foreach(_addc(_add, _combine))
        LIFT_RULES[(_packet.Scalar, 3)] = _foreach(_addc(_add, _combine))
LIFT_RULES[(aten._foreach_lerp_.Scalar, 2)] = _foreach(_substitute(aten.lerp_.Tensor, 2))


def liftable(func: Any, where: int | str, dtype: torch.dtype | None) -> bool:
    """Whether a float argument can become a graph input (its op has a Tensor form)."""
    return dtype in (torch.float32, torch.float64) and (func, where) in LIFT_RULES


# --- FX graph -------------------------------------------------------------------------------


def build_graph(
    ops: Sequence[OpRecord],
    input_count: int,
    floats: Sequence[float],
    lifted: dict[int, tuple[int, torch.dtype]],
    slot_places: dict[tuple, int],
    outputs: Sequence[Ref],
) -> fx.GraphModule:
    """An FX graph of the recorded aten ops.

    ``lifted`` maps a float slot to (its index in the scalars vector, the dtype to compute in);
    ``slot_places`` maps (op index, argument) to the float slot recorded there ((op index,
    argument, item) inside a list argument). With lifted
    slots the graph takes one more input, the float64 scalars vector.
    """
    builder = GraphBuilder(input_count, floats, lifted, slot_places)
    for index, op in enumerate(ops):
        builder.add(index, op, ops)
    return builder.finish(outputs)


class GraphBuilder:
    """``build_graph``'s state: the FX graph so far, its inputs, and a node per recorded op
    (``env``, a list of nodes for a foreach op written out per element)."""

    def __init__(
        self,
        input_count: int,
        floats: Sequence[float],
        lifted: dict[int, tuple[int, torch.dtype]],
        slot_places: dict[tuple, int],
    ) -> None:
        self.graph = graph = fx.Graph()
        self.lifted, self.slot_places = lifted, slot_places
        inputs = [graph.placeholder(f"in{i}") for i in range(input_count)]
        self.scalars = graph.placeholder("scalars") if lifted else None
        self.env: list[fx.Node | list[fx.Node]] = []
        self.items: dict[Node, fx.Node] = {}
        self.lookup = decoder(inputs, floats, self.env, self.item)
        self.last_fill: fx.Node | None = None

    def item(self, ref: Node, node: fx.Node | list[fx.Node]) -> fx.Node:
        """Output ``ref.out`` of a multi-output op, picked once."""
        if type(node) is list:  # a foreach op written out per element
            return node[ref.out]
        if ref not in self.items:
            self.items[ref] = self.graph.call_function(operator.getitem, (node, ref.out))
        return self.items[ref]

    def lifted_scalar(self, slot: int) -> fx.Node:
        position, dtype = self.lifted[slot]
        scalar = _call(self.graph, aten.select.int, self.scalars, 0, position)
        return _call(self.graph, aten._to_copy.default, scalar, dtype=dtype)

    def lifted_list(self, index: int, where: int | str, values: list) -> list[fx.Node] | None:
        """A list argument (a foreach op's scalars) with lifted elements: each element as a
        0-dim tensor, lifted or constant; None when none is lifted."""
        slots = [self.slot_places.get((index, where, k)) for k in range(len(values))]
        dtypes = [self.lifted[s][1] for s in slots if s in self.lifted]
        if not dtypes:
            return None
        return [
            self.lifted_scalar(s)
            if s in self.lifted
            else _call(self.graph, aten.scalar_tensor.default, v, dtype=dtypes[0])
            for s, v in zip(slots, values, strict=True)
        ]

    def add(self, index: int, op: OpRecord, ops: Sequence[OpRecord]) -> None:
        """The node of recorded op ``index``: a random fill of a fresh buffer, an op with a
        lifted float rewritten to take it as a tensor, or the op as recorded."""
        args = [resolve(a, self.lookup) for a in op.args]
        kwargs = {k: resolve(v, self.lookup) for k, v in op.kwargs.items()}
        buffer = op.args[0] if op.args else None
        if (
            type(buffer) is Node
            and buffer.out is None
            and set(op.kwargs) <= {"generator"}
            and is_fresh_fill(op.func, op.kwargs, ops[buffer.op].func)
        ):
            params = [float(a) for a in args[1:]]
            fill = _call(self.graph, RANDOM_FILL, args[0], FILLS[op.func], params, self.last_fill)
            self.last_fill = self.env[buffer[1]] = fill  # the buffer, from here on, is the filled one
            self.env.append(fill)
            return
        node = self.with_lifted_float(index, op, args, kwargs)
        self.env.append(node if node is not None else self.graph.call_function(op.func, tuple(args), kwargs))

    def with_lifted_float(
        self, index: int, op: OpRecord, args: list, kwargs: dict[str, Any]
    ) -> fx.Node | None:
        """The op rewritten (``LIFT_RULES``) at its first argument holding lifted floats; None
        when it holds none."""
        for where in (*range(len(op.args)), *op.kwargs):
            slot = self.slot_places.get((index, where))
            value = args[where] if isinstance(where, int) else kwargs[where]
            if slot in self.lifted:
                scalar = self.lifted_scalar(slot)
            elif type(value) is list and (scalar := self.lifted_list(index, where, value)) is not None:
                pass
            else:
                continue
            return LIFT_RULES[(op.func, where)](self.graph, args, kwargs, scalar)
        return None

    def finish(self, outputs: Sequence[Ref]) -> fx.GraphModule:
        self.graph.output([self.lookup(ref) for ref in outputs])
        return fx.GraphModule(torch.nn.Module(), self.graph)


def never_compiled(graph: fx.GraphModule) -> str | None:
    """Why ``graph`` must run as captured rather than compiled, or None: an op whose outputs
    are sized when it runs (meta.SIZED_WHEN_RUN), which Inductor compiles with the meta
    kernel's sizes (mkldnn's LSTM layer: a hot RNN model's compiled call failed at its first
    run, ``expected Tensor() for op: aten.mkldnn_rnn_layer``)."""
    for node in graph.graph.nodes:
        target = getattr(node.target, "overloadpacket", None)
        if node.op == "call_function" and target is not None and target.__name__ in SIZED_WHEN_RUN:
            return f"{target} sizes its outputs when it runs"
    return None


def inductor_compile(graph: fx.GraphModule, examples: Sequence[Any]) -> Callable[..., Any]:
    """Inductor, with random ops drawing what eager PyTorch draws (``fallback_random``): a
    compiled group or hot call gives strict mode's numbers. Without autograd: what is
    compiled here never runs backward."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    rebuild_torn_binaries()
    with torch.no_grad(), inductor_config.patch(fallback_random=True):
        return compile_fx(graph, list(examples))
