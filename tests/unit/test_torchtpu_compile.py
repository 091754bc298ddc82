"""Compile mode's TorchTPU rules, driven through the real Dynamo on the CPU: which graphs reach
the device's compiler, and what a compile cell keeps out of the graph. (On a chip:
tests/tpu/test_tpu_training.py.)"""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo import trace_rules

from tpunb.cellcompile import BACKWARD_BREAK, _breaks, _new_breaks
from tpunb.runtimes.torchtpu_compile import (
    FAILED_GRAPH,
    OFF_DEVICE_GRAPH,
    DeviceGuardedBackend,
    OptimizerSteps,
    compile_cell_scope,
)


class Recording:
    """A compiler that notes each graph it is handed (by its ops) and runs it as captured."""

    def __init__(self) -> None:
        self.graphs: list[list[str]] = []

    def __call__(self, graph_module, example_inputs):
        ops = [str(n.target) for n in graph_module.graph.nodes if n.op in ("call_function", "call_method")]
        self.graphs.append(ops)
        return graph_module.forward


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.b(self.a(x).relu())


def test_a_function_touching_a_tensor_off_the_device_runs_as_written():
    """TorchTPU traces a CPU tensor as a TPU placeholder and then fails or aborts when the graph
    runs: such graphs never reach it, and their function runs as the user wrote it."""
    inner = Recording()
    guarded = DeviceGuardedBackend(inner, device_type="tpu")  # every tensor here is on the CPU
    torch._dynamo.reset()
    out = torch.compile(lambda x: (x * 2).sum(), backend=guarded)(torch.ones(3))
    assert float(out) == 6.0
    assert inner.graphs == [] and guarded.counts == {OFF_DEVICE_GRAPH: 1}
    assert guarded.last_reason.startswith("input 0 on cpu")


def test_the_functions_an_off_device_step_calls_still_compile():
    """As HF's Trainer's step moves its CPU batch to the chip with the model inlined: the step's
    graph touches a tensor off the device (here "meta" stands for the CPU and the CPU for the
    chip), so the step runs as written, and the model's forward, all on the device, compiles on
    its own. Run as captured instead, such a step trained wrongly on a v5e."""
    inner = Recording()
    guarded = DeviceGuardedBackend(inner, device_type="cpu")
    torch.manual_seed(0)
    model = MLP()

    def step(batch):
        marker = torch.empty(1, device="meta")  # a tensor off the device, as the CPU batch is
        return model(batch).sum() + marker.numel()

    batch = torch.randn(5, 4)
    torch._dynamo.reset()
    try:
        out = torch.compile(step, backend=guarded)(batch)
    finally:
        torch._dynamo.reset()
    assert float(out) == float(model(batch).detach().sum()) + 1
    assert guarded.counts == {OFF_DEVICE_GRAPH: 1} and "on meta" in guarded.last_reason
    assert len(inner.graphs) == 1 and any("linear" in op or "Linear" in op for op in inner.graphs[0]), (
        inner.graphs
    )


def test_a_graph_on_the_device_reaches_the_compiler_and_a_function_it_refuses_runs_as_written():
    inner = Recording()
    on_device = DeviceGuardedBackend(inner, device_type="cpu")
    torch._dynamo.reset()
    torch.compile(lambda x: x + 1, backend=on_device)(torch.ones(2))
    assert len(inner.graphs) == 1 and not on_device.counts

    def refuses(graph_module, example_inputs):
        raise NotImplementedError("aten.frobnicate has no TPU lowering")

    refused = DeviceGuardedBackend(refuses, device_type="cpu")
    torch._dynamo.reset()
    assert torch.compile(lambda x: x - 1, backend=refused)(torch.ones(2)).tolist() == [0.0, 0.0]
    assert refused.counts == {FAILED_GRAPH: 1}
    assert refused.last_reason == "NotImplementedError: aten.frobnicate has no TPU lowering"


def test_a_compile_cell_keeps_backward_clipping_and_the_optimizer_out_of_the_graph():
    """TorchTPU turns trace_autograd_ops on; a backward traced into the graph trained wrongly on
    the chip, so a compile cell there breaks at backward() and runs the weight update, the clip
    and the optimizer's step (and zero_grad, and a scheduler), outside Dynamo, where the cell's
    DEFER_AND_FUSE fuses them. The losses are eager's."""

    def train(compiled: bool) -> list[float]:
        torch.manual_seed(0)
        model = MLP()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.9**s)

        def step(x):
            loss = model(x).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as HF's Trainer does
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            return loss.detach()

        run = torch.compile(step, backend=inner) if compiled else step
        return [float(run(torch.full((5, 4), float(i)))) for i in range(1, 4)]

    inner = Recording()
    steps = OptimizerSteps()
    previous = torch._dynamo.config.trace_autograd_ops
    torch._dynamo.config.trace_autograd_ops = True  # as torch_tpu's import sets it
    skipped_before = set(trace_rules.FORCE_SKIP_FILES)
    try:
        torch._dynamo.reset()
        before = _breaks()
        with compile_cell_scope(steps):
            assert torch._dynamo.config.trace_autograd_ops is False
            compiled = train(compiled=True)
        breaks = _new_breaks(before, _breaks())
        assert torch._dynamo.config.trace_autograd_ops is True  # restored
    finally:
        torch._dynamo.config.trace_autograd_ops = previous
        torch._dynamo.reset()  # Dynamo remembers the optimizer frames it ran uncompiled
    assert compiled == train(compiled=False)
    assert skipped_before == trace_rules.FORCE_SKIP_FILES
    assert steps.counts == {"step of AdamW": 3}
    assert BACKWARD_BREAK in breaks and "clip_grad_norm_ (runs outside the graph)" in breaks, breaks
    traced = [op for graph in inner.graphs for op in graph]
    assert traced and not any("foreach" in op or "addcdiv" in op for op in traced), traced


def test_a_compile_cell_makes_hugging_faces_attention_mask_outside_the_graph(tiny_llama):
    """A Llama forward without its cache (as HF's Trainer runs it) compiled whole by TorchTPU
    gave logits off by 1.6x their largest on a v5e, the mask built inside the graph; made op by
    op and handed in, it gave strict's. In a compile cell the mask's construction (its ``le`` on
    position ranges) is a graph break and the attention's graph takes the mask as an input."""
    model, ids = tiny_llama
    inner = Recording()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            expected = model(input_ids=ids, use_cache=False).logits
            before = _breaks()
            with compile_cell_scope(OptimizerSteps()):
                got = torch.compile(model, backend=inner)(input_ids=ids, use_cache=False).logits
            breaks = _new_breaks(before, _breaks())
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, expected)
    assert "create_causal_mask (runs outside the graph)" in breaks, breaks
    traced = [op for graph in inner.graphs for op in graph]
    assert "<built-in function scaled_dot_product_attention>" in traced
    assert "<built-in function le>" not in traced, traced
