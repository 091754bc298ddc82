"""What fused cells on TorchTPU compile beside DEFER_AND_FUSE: a module trained again and again,
whole, by TorchTPU's ``"tpu"`` compiler (fuse/trained_modules.py), with compile mode's rules
(torchtpu_compile.py: a graph with a tensor off the chip is not handed to TorchTPU, HF's
attention masks are made op by op), unless its graph draws random numbers or the module holds
a BatchNorm (``without_batchnorm``).

TorchTPU's compiler draws a compiled graph's random numbers its own way, and strict draws them
op by op from the chip's generator: a compiled dropout would change what the user's model
trains on. So a graph that draws (dropout with a rate above zero and training on, ``torch.rand``
and its kin, in-place random fills) runs as Dynamo captured it, op by op, under the cell's
DEFER_AND_FUSE, and the cell says why once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tpunb.fuse.compilers import Compile
from tpunb.runtimes.torchtpu_compile import attention_mask_files, off_device, run_as_written

#: What capturing and compiling a trained model costs a fused cell on the chip, for the rent
#: or buy (``TrainedModules.pays_off_after_s``). Measured on a v5e (GPT-2, 6 layers, 384 wide,
#: 8 x 256, bf16): a 12-step fused cell took 54.5 s with the model turned hot at its second
#: step against 25.5 s under DEFER_AND_FUSE alone (strict: 8.6 s); once compiled, a step took 30
#: ms against DEFER_AND_FUSE's 70.
TPU_COMPILE_COST_S = 30.0
#: Functions that draw random numbers, as Dynamo's graphs name them.
RANDOM_FUNCTIONS = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "rand_like",
        "randn_like",
        "randint_like",
        "randperm",
        "bernoulli",
        "normal",
        "multinomial",
        "poisson",
    }
)
#: Dropouts: random only at a rate above zero in training (their rate, their training flag).
DROPOUTS = frozenset(
    {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
)
#: Tensor methods that fill in place with random numbers.
RANDOM_METHODS = frozenset(
    {
        "bernoulli",
        "bernoulli_",
        "uniform_",
        "normal_",
        "random_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
    }
)


def _argument(node: torch.fx.Node, position: int, name: str, default: Any) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[position] if len(node.args) > position else default


def draws_random(graph: torch.fx.GraphModule) -> str | None:
    """What in ``graph`` (a Dynamo graph of torch functions) draws random numbers, or None."""
    for node in graph.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target))
        if node.op == "call_method" and node.target in RANDOM_METHODS:
            return f"Tensor.{node.target}"
        if node.op != "call_function":
            continue
        if name in RANDOM_FUNCTIONS:
            return name
        if name in DROPOUTS and _argument(node, 1, "p", 0.5) != 0 and _argument(node, 2, "training", True):
            return name
        if name == "scaled_dot_product_attention" and _argument(node, 4, "dropout_p", 0.0) != 0:
            return "scaled_dot_product_attention with dropout"
    return None


class DrawsRandom(RuntimeError):
    """A graph left uncompiled because it draws random numbers (the message says which op)."""


def refusing_random(backend: Compile) -> Compile:
    """``backend`` (a Dynamo backend that compiles forward and backward) for the graphs that
    draw no random numbers; one that draws is refused (``DrawsRandom``) and runs as captured."""

    def compile_training(graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
        random = draws_random(graph)
        if random is not None:
            raise DrawsRandom(
                f"left as captured, op by op: it draws random numbers ({random}), and compiled "
                "for the chip it would not draw what strict mode draws"
            )
        return backend(graph, examples)

    return compile_training


def on_the_chip_only(backend: Compile) -> Compile:
    """``backend`` for graphs whose every tensor is on the TPU: TorchTPU fails or aborts the
    process on one that takes or makes a CPU tensor (torchtpu_compile.py)."""

    def compile_training(graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
        stray = off_device(graph, examples, "tpu")
        if stray:
            raise OffTheChip(f"left as captured, op by op: tensors off the TPU ({', '.join(stray[:3])})")
        return backend(graph, examples)

    return compile_training


class OffTheChip(RuntimeError):
    """A graph left uncompiled because it takes or makes a tensor off the TPU."""


def tpu_training_compiler() -> Compile:
    """TorchTPU's ``"tpu"`` Dynamo backend (it runs AOTAutograd itself), for graphs on the chip
    that draw no random numbers."""
    from torch._dynamo.backends.registry import lookup_backend

    return refusing_random(on_the_chip_only(lookup_backend("tpu")))


def hot_call_settings() -> contextlib.AbstractContextManager[None]:
    """Dynamo's settings for a trained module's compiled call: HF's masks made op by op."""
    return run_as_written(attention_mask_files())


def without_batchnorm(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds no BatchNorm layer. TorchTPU 0.2.0 leaves BatchNorm's running
    statistics out in eager modes, and tpunb folds them in from a global module hook
    (torchtpu_batchnorm.py) that a compiled call would trace into its graph; what TorchTPU's
    compiled BatchNorm does with them was not measured. Such a model stays under DEFER_AND_FUSE."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return not any(isinstance(layer, _BatchNorm) for layer in module.modules())
