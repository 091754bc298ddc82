"""Compile mode on TorchTPU: what its ``"tpu"`` compiler can be given, and what runs beside it.

Measured on a TPU v5e (torch_tpu 0.2.0), a training cell handed whole to
``torch.compile(backend="tpu")`` failed three ways:

* a graph that takes a CPU tensor (AdamW's step counters are CPU scalars) fails when it runs
  (``failed to prepare compiled mode arguments ... expected tensor to be on tpu, got cpu``), and
  one that makes a CPU tensor (a model built inside the cell) aborts the whole process;
* with TorchTPU's ``trace_autograd_ops`` on (its import turns it on), Dynamo traces
  ``loss.backward()`` into the graph, and the step that results updates the weights wrongly: the
  losses leave strict's from the second step (6.2518 against 6.2585 on a small GPT-2), with or
  without a compiled optimizer step, and with ``capturable=True`` AdamW too;
* a compiled ``model`` with the rest of the step run by TorchTPU's DEFER_AND_FUSE gave strict's
  losses (within 1e-4) at 4x strict's speed.

So a compile cell on TorchTPU compiles the graphs Dynamo finds in it, except: a function whose
graph has any tensor off the TPU, or that TorchTPU refuses, runs as written, and the functions
it calls get their own chance (``DeviceGuardedBackend``); ``backward()`` is a graph break, so
autograd runs the compiled backward as it does for ``model.compile()``; optimizer steps and
gradient clipping run outside Dynamo, under the cell's DEFER_AND_FUSE, which fuses each step
with its clip into one program; and Hugging Face's attention masks are made op by op and handed
to the compiled attention as inputs (``compile_cell_scope``). The masks are there because
HF's ``Trainer.train()`` trained wrongly in a compile cell on a v5e (its first loss strict's,
its clipped gradient at step 1 half of strict's, the model left after 6 steps worse) while the
same model's own compiled loop trained as strict: the Trainer turns the model's cache off, and
a Llama forward without its cache compiled whole gave logits off by 1.6x their largest, with
the mask built inside the graph (see ``attention_mask_files``). With the mask made outside, the
Trainer's compile cell gave strict's losses there (within 8.3e-04). What ran uncompiled is
counted for the cell's summary (the steps; a clip is part of one).
Dynamo remembers a frame it ran uncompiled: torch.optim's frames that ran in a compile cell
stay uncompiled when later code compiles (on TorchTPU, where compiled steps trained wrongly,
the safe side).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

#: What compile cells run uncompiled here (``Runtime.counters()`` keys, after UNCOMPILED):
#: functions with a tensor off the chip or that TorchTPU refused, and optimizer steps.
OFF_DEVICE_GRAPH = "function with tensors off the TPU"
FAILED_GRAPH = "function TorchTPU could not compile"
OPTIMIZER_STEP = "step of {}"


def off_device(graph_module: Any, example_inputs: list[Any], device_type: str) -> list[str]:
    """Where a graph touches a tensor that is not on ``device_type``: its inputs, and every
    value its nodes make (as Dynamo's fake tensors recorded them), named for the record."""
    import torch

    found = [
        f"input {index} on {value.device.type}"
        for index, value in enumerate(example_inputs)
        if isinstance(value, torch.Tensor) and value.device.type != device_type
    ]
    for node in graph_module.graph.nodes:
        value = node.meta.get("val", node.meta.get("example_value"))  # AOT's, or Dynamo's
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, torch.Tensor) and item.device.type != device_type:
                found.append(f"{node.name} on {item.device.type}")
                break
    return found


class DeviceGuardedBackend:
    """A Dynamo backend that hands a graph to ``inner`` (TorchTPU's compiler) only when every
    tensor it takes and makes is on the device. TorchTPU treats a CPU tensor as a TPU placeholder
    when it compiles, then fails or aborts when the graph runs. Such a function, and one whose
    graph ``inner`` cannot compile, runs as written from then on (Dynamo's ``SkipFrame``), and
    the functions it calls are traced on their own: the model's forward, once the batch is on
    the chip, still compiles. Running the captured graph instead keeps the choices the traced
    code made for tracing: HF's Trainer moves its CPU batch to the chip in the graph of its
    training step, with the model inlined, and that graph run op by op on a v5e (HF builds an
    explicit causal mask when it sees Dynamo) trained wrongly (the logged losses fell faster
    than strict's, the model's loss after 6 steps was 5.57 against strict's 4.47).
    ``counts`` says how many functions ran uncompiled, by reason."""

    def __init__(self, inner: Callable[..., Any], device_type: str = "tpu") -> None:
        self.inner = inner
        self.device_type = device_type
        self.counts: Counter[str] = Counter()
        self.last_reason: str | None = None

    def __call__(self, graph_module: Any, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._dynamo.exc import SkipFrame

        stray = off_device(graph_module, example_inputs, self.device_type)
        if stray:
            self._run_as_written(OFF_DEVICE_GRAPH, ", ".join(stray[:3]))
            raise SkipFrame(f"tensors off the {self.device_type.upper()}: {self.last_reason}")
        try:
            return self.inner(graph_module, example_inputs)
        except Exception as error:  # an op or a shape TorchTPU's lowering refuses
            first_line = (str(error).splitlines() or [""])[0][:200]
            self._run_as_written(FAILED_GRAPH, f"{type(error).__name__}: {first_line}")
            raise SkipFrame(f"the compiler refused it: {self.last_reason}") from error

    def _run_as_written(self, why: str, reason: str) -> None:
        self.counts[why] += 1
        self.last_reason = reason


@functools.cache
def weight_update_files() -> frozenset[str]:
    """The source files, as Dynamo names code, of what updates weights and gradients in place:
    torch.optim (its steps, wrappers, kernels and schedulers) and gradient clipping."""
    import torch.nn.utils.clip_grad
    import torch.optim

    optim = glob.glob(os.path.join(os.path.dirname(torch.optim.__file__), "*.py"))
    return frozenset({*optim, torch.nn.utils.clip_grad.__file__})


@functools.cache
def attention_mask_files() -> frozenset[str]:
    """The source file of Hugging Face's attention masks (``transformers/masking_utils.py``),
    found without importing transformers. A Llama forward with ``use_cache=False`` (as HF's
    Trainer runs it) compiled whole by ``torch.compile(backend="tpu")`` gave logits off by 1.6x
    their largest on a v5e (torch_tpu 0.2.0, transformers 5.20), with SDPA and with eager
    attention alike, while the mask compiled alone was right and the forward with the mask made
    outside the graph gave strict's logits (7.9e-07): so the mask is built op by op and handed
    to the compiled attention as an input."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return frozenset()
    return frozenset({os.path.join(os.path.dirname(spec.origin), "masking_utils.py")})


class OptimizerSteps:
    """Counts the optimizer steps taken while it listens, by optimizer class."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.counts[OPTIMIZER_STEP.format(type(optimizer).__name__)] += 1

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self)
        try:
            yield
        finally:
            handle.remove()


@contextlib.contextmanager
def run_as_written(files: frozenset[str]) -> Iterator[None]:
    """Dynamo leaves the code of ``files`` alone in the block (a call into them is a graph
    break and runs as the cell's eager mode runs it); its list is restored afterwards, even on
    error, without the files it held before."""
    from torch._dynamo import trace_rules

    added = files - trace_rules.FORCE_SKIP_FILES
    trace_rules.FORCE_SKIP_FILES.update(added)
    try:
        yield
    finally:
        trace_rules.FORCE_SKIP_FILES.difference_update(added)


@contextlib.contextmanager
def compile_cell_scope(steps: OptimizerSteps) -> Iterator[None]:
    """While a compile cell runs (on the notebook thread): ``backward()`` is a graph break, and
    Dynamo leaves torch.optim's code, gradient clipping and HF's attention masks alone, so each
    optimizer step (counted in ``steps``), each clip and each mask runs as the cell's eager mode
    runs it. Dynamo's settings are restored afterwards, even on error."""
    import torch._dynamo

    with (
        run_as_written(weight_update_files() | attention_mask_files()),
        torch._dynamo.config.patch(trace_autograd_ops=False),
        steps.listening(),
    ):
        yield
