"""The compiled code of hot module calls, one per architecture and regime, shared by every
module of that architecture: a model built again (a set-up cell run again, a fresh model per
experiment) runs the code its predecessor compiled, from its first hot call.

A notebook rebuilds its model all the time: the set-up cell is run again before the training
cell, with a new learning rate or seed. With a compiled call per module, each new model paid
its predecessor's compile again (Dynamo's capture on the notebook's thread, Inductor on the
worker) and, until that compile paid off (plan.py's ``compile_pays_off``), ran eagerly: a
training cell run again was never faster than strict mode. Dynamo guards a module passed as
an argument by what its code reads (its type, flags, shapes), not by identity, and with
``inline_inbuilt_nn_modules`` its parameters are graph inputs, not constants, so a graph
captured for one module runs another of the same architecture as is (measured: no recompile,
no capture). So the compiled call takes the module as its first argument, and its code is
shared by the modules whose class, parameter and buffer names, shapes and dtypes agree
(``architecture``); each architecture gets a code object of its own, so Dynamo's limit of
compiled versions per code object (8) counts its input shapes, not how often it was built.

An optimizer's step is not shared (hotsteps.py): Dynamo keeps an optimizer's state as the
graph's own tensors, so another optimizer's step fails its guards.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tpunb.fuse.groups.compilers import Compile
from tpunb.fuse.groups.graph import never_compiled
from tpunb.fuse.groups.plan import Regime
from tpunb.fuse.hot.compile_later import CompileLater, CountedGraph, GraphRuns

if TYPE_CHECKING:
    from tpunb.fuse.ports import HotPathEngine

#: A module's architecture: its class, and each parameter's and buffer's name, shape and dtype.
Architecture = tuple[Any, ...]


def architecture(module: torch.nn.Module) -> Architecture:
    """What modules sharing compiled code have in common (Dynamo's guards check the rest)."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return (type(module), *((name, tuple(t.shape), t.dtype) for name, t in tensors))


#: What a module shares with the modules of earlier definitions of its classes (``lineage``).
Lineage = tuple[Any, ...]


def lineage(module: torch.nn.Module, shape: Architecture) -> Lineage:
    """``architecture`` with each class of the module and its submodules named by where it is
    defined and the code of its methods, not by the class object: a script run again with
    ``%run`` defines its classes anew, with equal code (code objects compare their bytes,
    constants, names and line numbers), while a class edited between runs differs. What an
    earlier definition measured about compiling its calls (``HotCodes.saving``) holds for it.
    (``shape``: the module's ``architecture``, which its hot call has made already.)"""
    classes = dict.fromkeys(type(sub) for sub in module.modules())
    definitions = tuple((cls.__module__, cls.__qualname__, _methods(cls)) for cls in classes)
    return (definitions, *shape[1:])


def _methods(cls: type) -> tuple[tuple[str, Any], ...]:
    return tuple((name, value.__code__) for name, value in vars(cls).items() if hasattr(value, "__code__"))


@dataclass
class HotCode:
    """One architecture's compiled call in one regime: Dynamo's entry point, the backend that
    compiles its graphs (``later``: the worker's, for training), and how often they ran."""

    compiled: Callable[..., Any]  # compiled(module, *args, **kwargs)
    runs: GraphRuns
    later: CompileLater | None
    ran_compiled: bool = False  # a call has run compiled: later modules compile at once
    slower: bool = False  # compiled, a module's calls ran slower than eagerly (payoff.py)

    @property
    def compiling(self) -> bool:
        return self.later is not None and self.later.compiling


class HotCodes:
    """An engine's compiled calls, by architecture and regime, made at their first compiled
    call (a module whose compile never pays off never imports Dynamo's machinery)."""

    def __init__(self, engine: HotPathEngine) -> None:
        self.engine = engine
        self._codes: dict[tuple[Architecture, Regime], HotCode] = {}
        #: each lineage seen, numbered (a lineage hashes a tuple per tensor: hashed once)
        self._kins: dict[Lineage, int] = {}
        #: by lineage's number and regime: the share of an eager call its compiled call saved
        self._savings: dict[tuple[int, Regime], float] = {}

    def kin(self, module: torch.nn.Module, shape: Architecture) -> int:
        """The number of ``module``'s lineage (``shape``: its architecture), the same for its
        earlier and later definitions."""
        return self._kins.setdefault(lineage(module, shape), len(self._kins))

    def saving(self, kin: int, now: Regime) -> float:
        """What compiling saved a call of lineage ``kin`` in regime ``now``, as a share of the
        eager call (1.0, the whole call, where none was measured)."""
        return self._savings.get((kin, now), 1.0)

    def measured(self, kin: int, now: Regime, saving: float) -> None:
        self._savings[(kin, now)] = saving

    def get(self, shape: Architecture, now: Regime) -> HotCode | None:
        return self._codes.get((shape, now))

    @property
    def count(self) -> int:
        """How many codes were made: a call that found none for its architecture need not
        look again (and hash its key, a tuple per parameter) until this changes."""
        return len(self._codes)

    def made(self, shape: Architecture, now: Regime, name: str) -> HotCode:
        """The code of ``shape``'s calls in regime ``now``, made if new (``name``: its class's)."""
        code = self._codes.get((shape, now))
        if code is None:
            code = self._codes[(shape, now)] = self._make(now, name)
        return code

    def _make(self, now: Regime, name: str) -> HotCode:
        runs = GraphRuns()
        engine = self.engine
        if now is Regime.INFERENCE:
            compile_graph = engine.compiler.compile_graph

            def counted(graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
                return CountedGraph(compiled_or_captured(compile_graph, graph, examples), runs)

            return HotCode(torch.compile(calling(module_call), backend=counted), runs, None)
        later = CompileLater(
            engine.cache,
            f"{name}-training",
            lambda: engine.options.sync_compile,
            runs,
            engine.compiler.compile_training,
        )
        # static shapes: the worker compiles after Dynamo has installed its guards, so the
        # compile must not add shape guards of its own
        return HotCode(torch.compile(calling(module_call), backend=later, dynamic=False), runs, later)


def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A module's own call (hooks included), with the module an argument: what Dynamo captures."""
    return module._call_impl(*args, **kwargs)


def calling(function: Callable[..., Any]) -> Callable[..., Any]:
    """A frame of tpunb's around ``function`` (a module's call, an optimizer's step), for Dynamo
    to start from, with a code object of its own.

    A compiled ``_call_impl`` itself is a frame of ``torch.nn``, which Dynamo skips, so a model
    made of ``torch.nn``'s own modules (an ``nn.Sequential`` of layers) was never compiled;
    from this frame Dynamo inlines ``_call_impl``, the module's forward and its submodules.
    And Dynamo keeps at most ``recompile_limit`` (8) compiled versions per code object: one
    per architecture (or optimizer) keeps that limit for its input shapes."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    name = f"hot_call_{next(_CALL_NUMBERS)}"
    call.__code__ = call.__code__.replace(co_name=name, co_qualname=name)
    return call


_CALL_NUMBERS = itertools.count(1)


def compiled_or_captured(
    compile: Compile, graph: torch.fx.GraphModule, example_inputs: list[Any]
) -> Callable[..., Any]:
    """``graph`` compiled by ``compile``, or, if the compiler fails on it or must not compile it
    (graph.never_compiled), the graph as captured."""
    if never_compiled(graph) is not None:
        return graph.forward
    try:
        return compile(graph, example_inputs)
    except Exception as error:  # any compiler failure: this graph runs op by op
        warnings.warn(
            f"tpunb fused: compiling a hot call failed ({type(error).__name__}: {error}); it runs op by op",
            RuntimeWarning,
            stacklevel=2,
        )
        return graph.forward
