"""Facts about an aten op that the engine needs on every call, computed once per op.

Schema walks cost microseconds; the engine records an op in a few, so everything it asks
of a schema (which arguments it writes, which returns alias which argument, whether its
floats shape its outputs, whether it is random) is read once here and cached by overload.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OpFacts:
    id: int  # a small integer standing for the op in keys (hashing an OpOverload is slow)
    name: str  # "aten.add_"
    mutated: tuple[int | str, ...]  # positions (or kwarg names) of arguments the op writes
    return_aliases: tuple[int | str | None, ...]  # per return: the written argument it *is*, or None
    view_returns: tuple[bool, ...]  # per return: a view of an input (non-writing alias)
    view_only: bool  # every return is a view and nothing is written: metadata only
    returns_tensor: bool  # any Tensor / Tensor[] return
    floats_keep_metadata: bool  # its float arguments never change its outputs' shape or dtype
    random: bool
    has_device_arg: bool
    argument_names: tuple[str, ...]
    boundary: bool  # always runs on its own, never inside a group (JAX ops: JAX compiles them)
    may_settle: bool  # may run at once on small settled values (settled.py): makes tensors, writes nothing
    tensorless: bool  # no tensor in its schema at all (profiler markers): nothing to record or wrap


#: Op namespaces that are flush boundaries: ``tpunb_jax`` ops run a JAX-compiled function.
BOUNDARY_NAMESPACES = frozenset({"tpunb_jax"})

_facts: dict[torch._ops.OpOverload, OpFacts] = {}
_by_id: list[OpFacts] = []


def facts_by_id(op_id: int) -> OpFacts:
    return _by_id[op_id]


def _is_tensor_type(type_: torch._C.JitType) -> bool:
    text = str(type_)
    return text.startswith("Tensor") or text.startswith("Optional[Tensor") or text == "List[Tensor]"


def facts(func: torch._ops.OpOverload) -> OpFacts:
    found = _facts.get(func)
    if found is None:
        found = _facts[func] = _compute(func, len(_facts))
        _by_id.append(found)
    return found


def _may_hold_tensor(type_: torch._C.JitType) -> bool:
    """Whether a value of ``type_`` can be or contain a tensor (``Any`` can)."""
    text = str(type_)
    return "Tensor" in text or "Any" in text


def _compute(func: torch._ops.OpOverload, op_id: int) -> OpFacts:
    schema = func._schema
    arguments = schema.arguments
    write_sets: dict[str, int | str] = {}
    mutated: list[int | str] = []
    for position, argument in enumerate(arguments):
        alias = argument.alias_info
        if alias is not None and alias.is_write:
            where: int | str = argument.name if argument.kwarg_only else position
            mutated.append(where)
            for name in alias.before_set:
                write_sets[name] = where
    return_aliases: list[int | str | None] = []
    view_returns: list[bool] = []
    for ret in schema.returns:
        alias = ret.alias_info
        target = None
        if alias is not None and alias.is_write:
            target = next((write_sets[n] for n in alias.before_set if n in write_sets), None)
        return_aliases.append(target)
        view_returns.append(alias is not None and not alias.is_write)
    tags = set(func.tags)
    returns_tensor = any(_is_tensor_type(r.type) for r in schema.returns)
    random = torch.Tag.nondeterministic_seeded in tags
    boundary = func.namespace in BOUNDARY_NAMESPACES
    return OpFacts(
        id=op_id,
        name=str(func.overloadpacket),
        mutated=tuple(mutated),
        return_aliases=tuple(return_aliases),
        view_returns=tuple(view_returns),
        view_only=bool(view_returns) and all(view_returns) and not mutated,
        returns_tensor=returns_tensor,
        # pointwise ops, and foreach ops (an optimizer's per-step scalars in a list)
        floats_keep_metadata=torch.Tag.pointwise in tags or func.__name__.startswith("_foreach_"),
        random=random,
        has_device_arg=any(a.name == "device" for a in arguments),
        argument_names=tuple(a.name for a in arguments),
        boundary=boundary,
        may_settle=returns_tensor and not mutated and not random and not boundary,
        tensorless=not any(_may_hold_tensor(a.type) for a in (*arguments, *schema.returns)),
    )
