"""A Dynamo backend for hot training calls: the captured graph runs at once, compiled later.

``torch.compile`` compiles a new graph on the thread that called it, before the call returns:
seconds per graph here, so the first steps of a training loop would wait for compiles the
user did not ask for. This backend hands Dynamo a function that runs the graph Dynamo
captured, as it is (eager PyTorch ops under autograd: strict's numbers and random draws),
and queues the graph on the compile worker, where the engine's compiler compiles it forward
and backward (compilers.py: Inductor through AOTAutograd, as ``torch.compile`` would, with
``fallback_random`` so dropout draws what eager draws). Once compiled, later calls run the
compiled code; the swap is one reference, read once per call.

The worker compiles in the tracing context Dynamo captured the graph in (its fake tensors,
its guards), after Dynamo has returned: the worker takes Dynamo's compile lock, so the two
never trace at once. A compile that fails leaves the graph running as captured, with one
warning on the notebook's thread (``GraphCache.emit_warnings``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from tpunb.fuse.groups.cache import Compiled, GraphCache, Variant, VariantState
from tpunb.fuse.groups.compilers import Compile
from tpunb.fuse.groups.graph import never_compiled
from tpunb.fuse.hot.flops import FlopsUnknown, training_flops
from tpunb.fuse.hot.thread_modes import ThreadModes
from tpunb.fuse.workarounds import config_values, skip_dynamo_in


def autograd_as_eager() -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd, set to behave as eager autograd does, where its defaults differ:

    * it compiles a graph's backward when the backward first runs, on the thread that runs
      it: the notebook's, seconds after the swap (measured: a 2.1 s step on a LoRA
      fine-tune). Here the backward compiles with the forward, on the worker;
    * it frees ("donates") saved activations in the backward, so a second backward through
      the same graph (``retain_graph=True``) fails. Not here; and torch checks the switch
      again when the backward runs, on the notebook's thread, so fused scopes turn it off
      there too (``donated_buffers_off``).

    (A torch without one of the switches keeps its default for it.)"""
    from torch._functorch import config

    wanted = {"force_non_lazy_backward_lowering": True, "donated_buffer": False}
    return config.patch({name: value for name, value in wanted.items() if hasattr(config, name)})


def donated_buffers_off() -> contextlib.AbstractContextManager[None]:
    """For a fused scope: a hot training call's backward runs with AOTAutograd's donated
    buffers off, as it was compiled (``autograd_as_eager``), so ``retain_graph`` works."""
    from torch._functorch import config

    return config_values(config, donated_buffer=False)


class GraphRuns:
    """How many times the graphs a Dynamo backend made have run. A hot call during which none
    ran was run by Dynamo as it is, uncompiled: past its recompile limit (8 versions of one
    frame), Dynamo runs a call that fits none of them without compiling it."""

    def __init__(self) -> None:
        self.count = 0
        #: FLOPs of the compiled runs among them, where the backend counts them (``count_flops``)
        self.flops = 0.0


class CompileLater:
    """A Dynamo backend whose graphs ``compile`` compiles on ``cache``'s worker under ``name``
    (the hot call's group key); with ``wait()`` true (``sync_compile``) the call waits for them;
    with ``count_flops``, each graph's training FLOPs are counted before its compile (flops.py)
    and its compiled runs add them to ``runs.flops``."""

    def __init__(
        self,
        cache: GraphCache,
        name: str,
        wait: Callable[[], bool],
        runs: GraphRuns,
        compile: Compile,
        count_flops: bool = False,
    ) -> None:
        self.cache, self.name, self.wait, self.runs, self.compile = cache, name, wait, runs, compile
        self.count_flops = count_flops
        self.made: list[CompiledLater] = []

    def __call__(self, graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
        compiled = CompiledLater(
            self.cache, self.name, graph, examples, self.wait(), self.runs, self.compile, self.count_flops
        )
        self.made.append(compiled)
        return compiled

    def release(self) -> None:
        """Let go of the graphs it made, and of the tensors they hold: for an optimizer that is
        gone (hotsteps.py), whose step's graphs hold its parameters and state as attributes,
        while Dynamo keeps this backend with its cache entries for the rest of the process."""
        for compiled in self.made:
            compiled.release()
        self.made = []

    @property
    def compiling(self) -> bool:
        """Whether a graph it made still waits for (or is in) its compile."""
        return self.compiling_among_first(len(self.made))

    @property
    def all_compiled(self) -> bool:
        """Whether every graph it made runs compiled (none refused, none still compiling)."""
        return all(c.variant.done is not None and c.variant.done.fn is not None for c in self.made)

    def compiling_among_first(self, count: int) -> bool:
        """Whether one of the first ``count`` graphs it made still waits for its compile."""
        return any(c.variant.state is VariantState.COMPILING for c in self.made[:count])

    @property
    def flops_unknown(self) -> bool:
        """Whether a graph it made could not have its FLOPs counted (``CompiledLater.flops_unknown``)."""
        return any(c.flops_unknown is not None for c in self.made)


#: What a released graph runs: nothing (its optimizer is gone).
RELEASED = Compiled(fn=None, error="released: its optimizer is gone")


class CountedGraph:
    """A compiled graph that counts its runs in ``runs``."""

    def __init__(self, graph: Callable[..., Any], runs: GraphRuns) -> None:
        self.graph, self.runs = graph, runs

    def __call__(self, *args: Any) -> Any:
        self.runs.count += 1
        return self.graph(*args)


class CompiledLater:
    """The captured graph until the worker has compiled it, then the compiled code."""

    def __init__(
        self,
        cache: GraphCache,
        name: str,
        graph: torch.fx.GraphModule,
        examples: list[Any],
        wait: bool,
        runs: GraphRuns,
        compile: Compile,
        count_flops: bool = False,
    ) -> None:
        self.graph: torch.fx.GraphModule | None = graph
        self.runs = runs
        self.flops = 0.0  # one run's, once counted (count_flops)
        self.flops_unknown: str | None = None  # why they could not be counted
        self.variant = Variant(lifted={})
        reason = never_compiled(graph)
        if reason is not None:  # it runs as captured, for good
            self.variant.done = Compiled(fn=None, error=reason)
            return
        context = torch._guards.TracingContext.try_get()
        graph = copy_sharing_tensors(graph)  # a compiler may rewrite its graph; this one runs meanwhile
        # per thread, so read here: a graph captured without grad (an optimizer's step) would
        # compile on the worker as a training graph, one captured under bf16 autocast in fp32
        modes = ThreadModes.here()
        fakes = fakes_made_here(graph, examples, context)

        def job() -> tuple[Callable[..., Any], str]:
            with torch._guards.tracing(context), modes.entered(), autograd_as_eager():
                code = graph.code  # (before the compiler rewrites it)
                if count_flops:
                    try:
                        self.flops = training_flops(graph, examples)
                    except FlopsUnknown as why:
                        self.flops_unknown = str(why)
                compiled = compile(graph, examples)
            fakes.clear()
            return compiled, code

        if wait:  # inside Dynamo's compile, which holds the lock the worker would wait for
            cache.compile_here(name, self.variant, job)
        else:
            cache.compile(name, self.variant, job, wait=False)

    def __call__(self, *args: Any) -> Any:
        self.runs.count += 1
        done = self.variant.done
        if done is not None and done.fn is not None:
            self.runs.flops += self.flops
            return done.fn(*args)
        if self.graph is None:
            raise RuntimeError(
                "tpunb fused: a compiled step of an optimizer that no longer exists was called"
            )
        return self.graph(*args)

    def release(self) -> None:
        """Drop the graph and the compiled code (``CompileLater.release``)."""
        self.graph = None
        self.variant = Variant(lifted={}, done=RELEASED)


def fakes_made_here(
    graph: torch.fx.GraphModule, examples: list[Any], context: torch._guards.TracingContext | None
) -> list[Any]:
    """The fake tensors AOTAutograd will trace ``graph`` with, made now, on the notebook thread,
    and held until the worker's compile ends.

    AOTAutograd turns each real input and each of the graph's parameters into a fake tensor
    by reading its metadata, its ``.grad`` included. On the worker that read races the
    notebook thread, which meanwhile sets ``p.grad = None`` in ``zero_grad()`` (a segfault,
    seen once in CI). Its fake mode keeps what it made only while something holds it
    (a weak memo), and returns a held one without reading the tensor again: so they are made
    here, with the arguments AOTAutograd would use (``process_inputs``: Dynamo's symbolic
    context where Dynamo made one, static shapes for the graph's own parameters)."""
    fake_mode = context.fake_mode if context is not None else None
    if fake_mode is None:
        return []
    from torch._functorch import config as functorch_config
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    own = [t for _, t in graph.named_parameters(remove_duplicate=False)]
    own += [t for _, t in graph.named_buffers(remove_duplicate=False)]
    fakes: list[Any] = []
    for index, tensor in enumerate([*own, *examples]):
        if not isinstance(tensor, torch.Tensor) or isinstance(tensor, FakeTensor):
            continue
        if is_traceable_wrapper_subclass(tensor):
            continue
        symbolic = context.tensor_to_context.get(tensor)
        if symbolic is not None:
            source = symbolic.tensor_source
            fake = fake_mode.from_tensor(
                tensor, static_shapes=False, symbolic_context=symbolic, source=source, trace=False
            )
        elif index < len(own) and functorch_config.static_weight_shapes:
            fake = fake_mode.from_tensor(tensor, static_shapes=True)
        else:
            fake = fake_mode.from_tensor(tensor, static_shapes=False)
        fakes.append(fake)
    return fakes


def copy_sharing_tensors(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A deep copy of ``graph`` whose tensor attributes are the same tensors, not copies: an
    optimizer's graph holds its parameters and state as attributes (``get_attr``) and updates
    them in place, so a compiled copy of copies would update tensors nobody reads."""
    memo: dict[int, Any] = {}
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            value: Any = graph
            for name in node.target.split("."):
                value = getattr(value, name)
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value
    return copy.deepcopy(graph, memo)


#: Dynamo leaves these calls alone and every frame under them (the captured graph's own code):
#: otherwise it would look at each for a compile, first taking its compile lock, which the
#: worker holds for a whole compile (measured: a 3 s step at the first call after capture).
skip_dynamo_in(CompiledLater.__call__.__code__)
skip_dynamo_in(CountedGraph.__call__.__code__)
