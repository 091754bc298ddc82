"""Which compiler turns the engine's graphs into code: a parameter of the engine
(``FusionEngine(compiler=...)``), Inductor by default.

A fused group's graph (built from recorded ops, flush.py) never runs backward, since autograd's
ops are recorded as ops: it goes to ``compile_graph`` on the compile worker. The hot path
captures a hot module call or optimizer step with Dynamo (hotcode.py, hotsteps.py) and hands
each graph to the compiler in one of two ways: a graph that never runs backward (an inference
call), compiled where Dynamo asks for it (``compile_graph``); or a training graph, whose
backward autograd runs later, compiled on the compile worker inside the tracing context Dynamo
captured it in (``compile_training``, from compile_later.py, which sets AOTAutograd to behave as
eager autograd). Inductor is the native runtime's compiler; an accelerator's runtime brings its
own (TorchTPU's ``"tpu"`` Dynamo backend runs AOTAutograd itself), so the engine names no
compiler of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tpunb.fuse.groups.disk_cache import rebuild_torn_binaries
from tpunb.fuse.groups.graph import inductor_compile

#: A compiler's entry point: Dynamo's backend signature, ``(graph, example inputs) -> code``.
Compile = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]


@dataclass(frozen=True)
class GraphCompiler:
    """How one compiler compiles the hot path's graphs (``name``: for messages)."""

    name: str
    compile_graph: Compile  # without autograd: an inference call's graph
    compile_training: Compile  # forward and backward, in Dynamo's tracing context, grad mode as captured


def inductor_training(graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
    """Inductor through AOTAutograd (forward and backward), as ``torch.compile`` compiles a
    training graph, with random ops drawing what eager PyTorch draws (``fallback_random``): a
    hot training call gives strict mode's numbers and random stream."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    rebuild_torn_binaries()
    with config.patch(fallback_random=True):
        return compile_fx(graph, examples)


INDUCTOR = GraphCompiler("Inductor", inductor_compile, inductor_training)
