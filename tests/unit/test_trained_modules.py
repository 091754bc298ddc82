"""Modules trained again and again in fused scopes where the runtime fuses by itself (TorchTPU),
compiled whole by the runtime's compiler on tpunb's worker: driven on the CPU through the real
Dynamo, with ``aot_eager`` (forward and backward through AOTAutograd) in the chip compiler's place.
(On a chip: tests/tpu.)"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import lookup_backend
from torch._functorch._aot_autograd.utils import make_boxed_func

from tpunb.events import GroupStatus
from tpunb.fuse.groups.cache import GraphCache
from tpunb.fuse.hot.trained_modules import PAST_LIMIT_PLAN, TrainedModules
from tpunb.runtimes.torchtpu_fused import (
    OffTheChip,
    hot_call_settings,
    on_the_chip_only,
    without_batchnorm,
)


class Model(torch.nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.b(self.drop(self.a(x).relu()))


class Loop:
    """A model's training loop, its optimizer and random stream kept across ``run`` calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        torch.manual_seed(1)
        self.model, self.step = model, 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)

    def run(self, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            self.step += 1
            loss = self.model(torch.full((4, 8), float(self.step))).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            losses.append(loss.item())
        return losses


def train(model: torch.nn.Module, steps: int) -> list[float]:
    return Loop(model).run(steps)


def fresh(dropout: float = 0.0) -> Model:
    torch.manual_seed(0)
    return Model(dropout)


@pytest.fixture
def trained_with():
    """``TrainedModules`` with a given compiler, Dynamo reset around it and its hooks removed."""
    made: list[TrainedModules] = []

    def make(compiler: Callable[..., Any]) -> TrainedModules:
        made.append(TrainedModules(GraphCache(on_compiled=lambda name, variant: None), compiler))
        return made[-1]

    torch._dynamo.reset()
    yield make
    for trained in made:
        trained.cache.wait_idle()
        trained.close()
    torch._dynamo.reset()


@pytest.fixture
def trained(trained_with):
    return trained_with(lookup_backend("aot_eager"))


def test_a_module_stepped_twice_runs_compiled_whole_and_trains_as_eager(trained):
    expected = train(fresh(), 10)
    model = fresh()
    loop = Loop(model)
    with trained.scope():
        got = loop.run(8)
        trained.cache.wait_idle()
        backend = trained.hot[model]
        compiled = [made.variant.done for made in backend.made]
        runs = backend.runs.count
        got += loop.run(2)  # compiled calls
        assert backend.runs.count == runs + 2
    assert got == pytest.approx(expected, rel=1e-6)
    assert compiled and all(done is not None and done.fn is not None for done in compiled), compiled
    # steps 3-10: captured, run uncompiled while compiling, then compiled (the last two)
    assert trained.compiled_calls["Model"] >= 2
    assert trained.compiled_calls["Model"] + trained.calls_while_compiling["Model"] == 8
    runs = backend.runs.count
    train(model, 2)  # outside the scope: its own call
    with trained.scope(), torch.no_grad():
        model(torch.ones(4, 8))  # not training: its own call
    assert backend.runs.count == runs


def test_a_module_the_user_compiled_or_trained_once_is_left_alone(trained):
    """Nor does a model the user compiled recompile, or break its graph, at each fused cell."""
    from torch._dynamo.utils import counters

    compiled_by_user, wrapped, once = fresh(), fresh(), fresh()
    compiled_by_user.compile(backend="eager")
    optimized = torch.compile(wrapped, backend="eager")
    counters.clear()
    graphs = []
    for cell in range(3):
        with trained.scope():
            train(compiled_by_user, 4)
            train(optimized, 4)
            if cell == 0:
                train(once, 1)
        graphs.append(counters["stats"]["unique_graphs"])
    names = {
        id(compiled_by_user): "user",
        id(wrapped): "wrapped",
        id(optimized): "optimized",
        id(once): "once",
    }
    assert not [names.get(id(m), type(m).__name__) for m in trained.hot]
    assert graphs[0] > 0 and graphs == graphs[:1] * 3 and not counters["graph_break"], dict(counters)


def test_a_gpt2_with_its_dropouts_runs_compiled_whole_and_trains_as_eager(trained):
    """HF GPT-2 as configured by default: dropout after the embeddings, after each attention and
    MLP, and inside attention (``dropout_p``); given labels, captured as one graph."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64))

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    def steps(model, optimizer, count):
        losses = []
        for _ in range(count):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    model = build()
    torch.manual_seed(2)
    expected = steps(model, torch.optim.AdamW(model.parameters(), lr=0.01), 8)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    torch.manual_seed(2)
    with trained.scope():
        got = steps(model, optimizer, 6)
        trained.cache.wait_idle()
        got += steps(model, optimizer, 2)
    assert trained.compiled_calls["GPT2LMHeadModel"] >= 2, trained.compiled_calls
    # one graph: the ``logger.warning_once`` on its loss path is skipped, not a graph break
    assert len(trained.hot[model].made) == 1, trained.hot[model].made
    assert got == pytest.approx(expected, rel=1e-6)


class Noisy(torch.nn.Module):
    """A model that draws random numbers other than by dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.a(x + 0.1 * torch.randn_like(x))


@pytest.mark.parametrize("build", [lambda: fresh(dropout=0.3), Noisy], ids=["dropout", "randn_like"])
def test_a_module_that_draws_random_numbers_runs_compiled_whole_and_draws_as_eager(trained, build):
    """Its compiled graph draws in the order eager draws (on the chip, TorchTPU's compiled random
    ops draw strict's numbers: tests/tpu), and the stream goes on where eager's does."""
    torch.manual_seed(0)
    expected = train(build(), 8)
    expected_next = torch.rand(3)
    torch.manual_seed(0)
    model = build()
    loop = Loop(model)
    with trained.scope():
        got = loop.run(6)
        trained.cache.wait_idle()
        got += loop.run(2)
    assert got == pytest.approx(expected, rel=1e-6)
    assert torch.equal(torch.rand(3), expected_next)
    assert trained.compiled_calls[type(model).__name__] >= 2, trained.compiled_calls


def captured(module: torch.nn.Module, *args) -> torch.fx.GraphModule:
    graphs = []
    torch._dynamo.reset()
    torch.compile(module, backend=lambda graph, examples: graphs.append(graph) or graph.forward)(*args)
    torch._dynamo.reset()
    return graphs[0]


def eager_training_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """What the model's forward and backward compute, counted as they run eagerly."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x).pow(2).mean().backward()
    model.zero_grad()
    return counter.get_total_flops()


def test_compiled_calls_add_the_flops_of_their_forward_and_backward(trained):
    """For the cell's MFU (a frozen layer gets no weight gradient: fewer FLOPs)."""
    model, frozen = fresh(), fresh()
    frozen.a.weight.requires_grad_(False)
    for one in (model, frozen):
        expected = eager_training_flops(one, torch.ones(4, 8))
        loop = Loop(one)
        with trained.scope(sync_compile=True):
            before = trained.model_flops
            loop.run(3)  # the second call is captured and compiled in it; the third runs compiled
            assert trained.compiled_calls["Model"] >= 1
            assert trained.model_flops - before == expected * trained.compiled_calls["Model"]
        trained.compiled_calls.clear()
    assert eager_training_flops(frozen, torch.ones(4, 8)) < eager_training_flops(model, torch.ones(4, 8))


class DataDependent(torch.nn.Module):
    """A model whose output's shape depends on its input's values: its graph cannot run on fake
    tensors without a shape environment, so its FLOPs cannot be counted."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.a(x) * x.nonzero().shape[0]


def test_a_graph_whose_flops_cannot_be_counted_keeps_the_reason(trained):
    """No MFU then (a wrong one would be worse), but the reason is kept for whoever asks why."""
    model = DataDependent()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), trained.scope(sync_compile=True):
        Loop(model).run(3)
    made = trained.hot[model].made
    assert (
        trained.model_flops == 0
        and trained.calls_flops_unknown == trained.compiled_calls["DataDependent"] > 0
    )
    assert any(
        graph.flops_unknown and "DynamicOutputShapeException" in graph.flops_unknown for graph in made
    ), [(graph.flops, graph.flops_unknown) for graph in made]


def test_a_graph_off_the_chip_is_not_handed_to_the_chips_compiler():
    graph = captured(Model(0.0), torch.ones(2, 8))
    with pytest.raises(OffTheChip, match="tensors off the TPU"):
        on_the_chip_only(lambda graph, examples: graph.forward)(graph, [torch.ones(2, 8)])


def test_a_trained_llama_makes_its_attention_mask_outside_its_compiled_graphs(tiny_llama):
    """TorchTPU compiled a Llama forward wrongly with HF's mask built in its graph (see
    test_torchtpu_compile.py); a trained module's compiled call gets the mask as an input."""
    model, ids = tiny_llama
    traced: list[str] = []
    aot_eager = lookup_backend("aot_eager")

    def recording(graph, examples):
        traced.extend(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
        return aot_eager(graph, examples)

    torch._dynamo.reset()
    modules = TrainedModules(GraphCache(on_compiled=lambda name, variant: None), recording, hot_call_settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        with modules.scope():
            for _ in range(4):
                model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                modules.cache.wait_idle()
    finally:
        modules.close()
        torch._dynamo.reset()
    assert model in modules.hot
    assert "<built-in function scaled_dot_product_attention>" in traced
    assert "<built-in function le>" not in traced, traced


def test_a_model_with_batchnorm_stays_with_the_runtimes_eager_fusion(trained):
    """(TorchTPU's compiled BatchNorm statistics are unmeasured; tpunb keeps them in eager modes.)"""
    trained.eligible = without_batchnorm
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    with trained.scope():
        train(model, 4)
        train(fresh(), 4)
    assert [type(module).__name__ for module in trained.hot] == ["Model"]


def test_a_call_dynamo_cannot_capture_runs_as_written_and_the_module_stays_so(trained):
    """(Here Dynamo refuses a second capture, for a new batch size: ``error_on_recompile``.)"""
    model = fresh()
    loop = Loop(model)
    with trained.scope():
        loop.run(3)
        assert model in trained.hot
        trained.cache.wait_idle()  # (while the worker compiles, a new shape runs as it is)
        with (
            torch._dynamo.config.patch(error_on_recompile=True),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            model(torch.ones(3, 8)).sum().backward()
        loop.run(3)
    assert model not in trained.hot and model in trained.refused
    assert model._compiled_call_impl is None
    messages = [str(w.message) for w in caught]
    assert any("Model runs op by op from now on" in m and "RecompileError" in m for m in messages), messages


def test_a_module_turns_hot_once_its_steps_have_paid_for_a_compile_and_at_once_with_sync_compile(trained):
    """Steps that cost less than a compile leave it to the runtime's own fusion, in one cell or
    across cells; ``--sync-compile`` compiles at the second step, the call waiting for it."""
    trained.pays_off_after_s = 3600.0
    model = fresh()
    loop = Loop(model)
    for _cell in range(2):
        with trained.scope():
            loop.run(4)
    assert model not in trained.hot
    assert trained.steps_not_compiled == 8  # (a cell with any gives no MFU)
    with trained.scope(sync_compile=True):
        loop.run(1)
        assert model in trained.hot
        loop.run(1)  # captured and compiled in the call
        done = [made.variant.done for made in trained.hot[model].made]
        assert done and all(d is not None and d.fn is not None for d in done), done
        assert trained.compiled_calls["Model"] == 1
    assert not trained.capture_s, "--sync-compile asked for the call's wait: not counted as unasked"


def test_the_call_that_captures_a_module_counts_its_wait_by_class(trained):
    """The summary line says how long a cell waited while Dynamo captured its model on the
    notebook's thread (report.py): the captured call's seconds, counted once per capture."""
    model = fresh()
    loop = Loop(model)
    with trained.scope():
        started = time.perf_counter()
        loop.run(4)  # hot after its second step; its third call captured
        spent = time.perf_counter() - started
        trained.cache.wait_idle()
        assert model in trained.hot
        waited = trained.capture_s["Model"]
        loop.run(2)
    assert list(trained.capture_s) == ["Model"] and 0 < waited < spent
    assert trained.capture_s["Model"] == waited, "calls after the capture waited for none"


def test_a_steps_cost_counts_the_wait_between_steps_not_the_gap_between_cells(trained):
    """On a chip the host queues a step's work and waits where the loop reads a value (after the
    optimizer step): the cost of a step runs from the end of the one before it. A cell's first
    step counts from its first call, not from the last cell's end."""
    trained.pays_off_after_s = 0.3
    model = fresh()
    loop = Loop(model)
    with trained.scope():
        for _ in range(3):
            loop.run(1)
            time.sleep(0.2)  # the read's wait, after the step
    assert model in trained.hot
    other = fresh()
    loop = Loop(other)
    for _cell in range(3):
        with trained.scope():
            loop.run(1)
        time.sleep(0.3)  # between cells
    assert other not in trained.hot


def test_each_call_through_dynamo_has_a_group_row_as_the_native_hot_path_writes(trained):
    rows = []
    trained.publish = rows.append
    model = fresh()
    loop = Loop(model)
    with trained.scope():
        loop.run(3)  # the third call is captured
        trained.cache.wait_idle()
        loop.run(2)
    assert [row.key for row in rows] == ["Model-training"] * 3
    assert rows[0].status is GroupStatus.MISS and rows[-1].status is GroupStatus.HIT, rows
    # at the user's line that called the model (Loop.run's)
    assert all(row.whole_call and row.at == rows[0].at for row in rows), rows
    assert rows[0].at.startswith("test_trained_modules.py:"), rows[0].at


def dtypes_fixed_when_traced(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
    """``graph`` run as a real compiler's code runs: with the dtypes chosen when it was traced
    (autocast at run time no longer applies, as it does to ``aot_eager``'s ops)."""

    def run(*args: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            return graph(*args)

    return make_boxed_func(run)


def test_a_model_trained_under_bf16_autocast_compiles_in_bf16_on_the_worker(trained_with):
    """Autocast is per thread, and Dynamo leaves the cell's autocast out of the graph it captures:
    the compiler traces each op's dtype from the state it runs under. Compiled on tpunb's worker
    (autocast off there) a bf16 GPT-2 ran in fp32 on the chip: 70 ms a step against 51 ms
    compiled on the notebook thread, 3 GiB more memory, losses apart from strict's."""
    compiler = aot_autograd(fw_compiler=dtypes_fixed_when_traced, bw_compiler=dtypes_fixed_when_traced)
    trained = trained_with(compiler)
    with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
        expected = train(fresh(), 10)
        loop = Loop(fresh())
        with trained.scope():
            got = loop.run(8)
            trained.cache.wait_idle()
            compiled_before = trained.compiled_calls["Model"]
            got += loop.run(2)
    assert trained.compiled_calls["Model"] == compiled_before + 2  # the last two ran compiled
    assert got == pytest.approx(expected, rel=1e-6)


def test_the_worker_compiles_with_the_compiler_settings_the_notebook_set(trained_with):
    """torch's config values are context variables: a new thread sees their defaults. TorchTPU
    sets Dynamo's ``trace_autograd_ops`` at import, a user Inductor's options; the worker's
    compile must see them as a compile on the notebook's thread would."""
    import torch._inductor.config as inductor_config

    seen = []

    def compiler(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        seen.append(inductor_config.fallback_random)
        return lookup_backend("aot_eager")(graph, examples)

    trained = trained_with(compiler)
    loop = Loop(fresh())
    with inductor_config.patch(fallback_random=not inductor_config.fallback_random):
        wanted = inductor_config.fallback_random
        with trained.scope():
            loop.run(4)
            trained.cache.wait_idle()
    assert seen and set(seen) == {wanted}


class Broken(torch.nn.Module):
    """A model whose call Dynamo captures as two graphs (HF's masks, made outside Dynamo on
    TorchTPU, break GPT-2's call so)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(h)


def test_a_call_captured_as_several_graphs_does_not_wait_for_the_first_ones_compile(trained_with):
    """Once Dynamo hands the call's first graph over, the worker takes the compiler's lock for
    that graph's compile (seconds, on a chip a minute): the rest of the call, captured on the
    notebook thread, must not wait for it. (On the chip a GPT-2 step stalled 15 s at its swap.)"""
    release, compiled = threading.Event(), threading.Event()

    def slow(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        release.wait(10)
        compiled.set()
        return lookup_backend("aot_eager")(graph, examples)

    trained = trained_with(slow)
    torch.manual_seed(0)
    model = Broken()
    loop = Loop(model)
    try:
        with trained.scope():
            loop.run(2)  # hot after its second step
            loop.run(1)  # captured (two graphs)
            assert not compiled.is_set(), "the call waited for the worker's compile"
            backend = trained.hot[model]
            assert len(backend.made) == 2
            runs = backend.runs.count
            loop.run(1)  # its own call: neither graph runs as captured
            assert backend.runs.count == runs and trained.calls_while_compiling["Broken"] == 2
    finally:
        release.set()


class Shapes(torch.nn.Module):
    """A model called with two batch sizes (a last, smaller batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.a(x)


def test_a_new_shape_compiling_leaves_the_compiled_shapes_compiled(trained_with):
    """Once its first capture has compiled, a hot module stays compiled for the shapes it has:
    a new shape (an epoch's last, smaller batch) is captured and compiles on the worker, and
    meanwhile the known shape's calls run its compiled code, not the module's own call."""
    release = threading.Event()
    compiles = []

    def second_waits(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        compiles.append(graph)
        if len(compiles) > 1:
            release.wait(10)
        return lookup_backend("aot_eager")(graph, examples)

    trained = trained_with(second_waits)
    torch.manual_seed(0)
    model = Shapes()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(rows: int) -> None:
        model(torch.ones(rows, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    try:
        with trained.scope():
            for _ in range(3):
                step(4)  # hot after its second step, captured at its third
            trained.cache.wait_idle()
            step(2)  # a new shape: captured, its compile held
            backend = trained.hot[model]
            assert backend.compiling
            runs, compiled = backend.runs.count, trained.compiled_calls["Shapes"]
            step(4)
            assert backend.runs.count == runs + 1 and trained.compiled_calls["Shapes"] == compiled
    finally:
        release.set()


def test_calls_with_a_graph_whose_compile_failed_are_counted_as_partly_compiled(trained_with):
    """A graph whose compile fails runs as captured for good (with the cache's warning); its
    calls are counted apart, so the summary says so and gives no MFU."""

    def first_fails(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        if not any(node.op == "call_module" or "relu" in str(node.target) for node in graph.graph.nodes):
            return lookup_backend("aot_eager")(graph, examples)
        raise RuntimeError("no kernel for this graph")

    trained = trained_with(first_fails)
    torch.manual_seed(0)
    model = Broken()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with trained.scope(sync_compile=True):
            Loop(model).run(4)  # hot after its second step, captured and compiled at its third
    assert trained.partly_compiled_calls["Broken"] == 2, (
        trained.partly_compiled_calls,
        trained.compiled_calls,
    )
    assert trained.compiled_calls["Broken"] == 0


def test_a_model_built_anew_again_and_again_runs_compiled_whole_each_time(trained):
    """A set-up cell run again makes a new model of the same class each time. Dynamo keeps its
    versions of the model's ``forward`` per code object (8 by default), so from the ninth model
    on it ran the calls uncompiled while the summary said "compiled whole" (seen on the chip);
    the limit is now counted per model."""
    for built in range(10):
        model = fresh()
        with trained.scope(sync_compile=True):
            Loop(model).run(4)  # hot after its second step, captured and compiled at its third
        backend = trained.hot[model]
        ran = (built, len(backend.made), backend.runs.count)
        assert len(backend.made) == 1 and backend.runs.count == 2, ran
    assert trained.compiled_calls["Model"] == 20 and not trained.calls_past_version_limit


def test_models_long_gone_do_not_count_against_dynamos_cap_over_the_process(trained):
    """Dynamo's ``accumulated_recompile_limit`` (256) counts every version a code object ever
    had, dead models' too; HF's GPT-2 takes three a model and shape, so the 86th GPT-2 of a
    session ran uncompiled. Here the cap is 3 and six models are built in turn."""
    with torch._dynamo.config.patch(accumulated_recompile_limit=3):
        for built in range(6):
            model = fresh()
            with trained.scope(sync_compile=True):
                Loop(model).run(4)
            assert trained.hot[model].runs.count == 2, built
    assert trained.compiled_calls["Model"] == 12 and not trained.calls_past_version_limit


def test_a_model_of_a_class_compiled_past_dynamos_limit_elsewhere_still_compiles_whole(trained):
    """One ``generate`` compiled as a compile-mode cell compiles it (static shapes: a version per
    length) exhausts Dynamo's limit on GPT-2's own frames, which then run uncompiled for good:
    every GPT-2 trained in a later fused cell ran uncompiled (the chip's hardware suite). A
    trained module's versions are its own (``isolate_recompiles``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=64))

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    generator = build().eval()

    def generate() -> torch.Tensor:
        with torch.no_grad():
            return generator.generate(ids[:1, :8], max_new_tokens=12, do_sample=False, pad_token_id=0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(generate, backend="eager", dynamic=False)()
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    with trained.scope(sync_compile=True):
        for _ in range(4):  # hot after its second step, captured and compiled at its third
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert trained.compiled_calls["GPT2LMHeadModel"] == 2, (
        trained.compiled_calls,
        trained.calls_past_version_limit,
    )


class Disabled(torch.nn.Module):
    """A model whose forward Dynamo must not trace."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 1)

    @torch.compiler.disable
    def forward(self, x):
        return self.a(x)


def test_a_model_dynamo_captures_nothing_of_runs_its_own_call_and_says_so(trained):
    """Not "past the limit", and not "compiled whole": refused, with the warning."""
    model = Disabled()
    nothing = pytest.warns(RuntimeWarning, match="Dynamo captured nothing of its call")
    with nothing, trained.scope(sync_compile=True):
        Loop(model).run(4)
    assert model in trained.refused and model not in trained.hot
    assert not trained.compiled_calls and not trained.calls_past_version_limit


def test_a_model_that_is_gone_lets_go_of_its_graphs(trained):
    """Dynamo keeps each backend until it is reset; a set-up cell run again must not keep the
    graphs (and the tensors they hold) of every model it built."""
    import gc

    model = fresh()
    with trained.scope(sync_compile=True):
        Loop(model).run(4)
    backend = trained.hot[model]
    assert backend.made
    del model
    gc.collect()
    assert backend.made == []


def test_calls_past_dynamos_limit_of_versions_are_counted_as_uncompiled(trained):
    """A model called with a new shape at every step: once it has made Dynamo's limit of
    versions, a call that fits none runs as it is, counted apart (no "compiled whole", no MFU)."""
    from torch._dynamo import config

    rows = []
    trained.publish = rows.append
    torch.manual_seed(0)
    model = Shapes()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trained.scope(sync_compile=True):
        for batch in range(1, config.recompile_limit + 5):
            model(torch.ones(batch, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    # hot after its second step; then each call is captured (and compiled in it), the limit's
    # worth, and the last two run as they are
    assert len(trained.hot[model].made) == config.recompile_limit
    assert trained.calls_past_version_limit["Shapes"] == 2, trained.calls_past_version_limit
    assert trained.compiled_calls["Shapes"] == config.recompile_limit
    assert [row.plan for row in rows[-2:]] == [PAST_LIMIT_PLAN] * 2


def test_while_its_compile_is_pending_a_hot_module_runs_its_own_call(trained_with):
    """After the call that captured it, a module whose compile is on the worker runs its own
    call, not the captured graphs: under DEFER_AND_FUSE its own call reuses the programs its
    earlier steps made, the captured graphs would be new ones (on a v5e: 155 ms a GPT-2 step
    against 137, and an 11.6 s stall at the swap)."""
    release = threading.Event()

    def slow(graph: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        release.wait(10)
        return lookup_backend("aot_eager")(graph, examples)

    trained = trained_with(slow)
    rows = []
    trained.publish = rows.append
    expected = train(fresh(), 6)
    model = fresh()
    loop = Loop(model)
    try:
        with trained.scope():
            got = loop.run(3)  # hot after its second step, captured at its third
            backend = trained.hot[model]
            captured_runs = backend.runs.count
            got += loop.run(2)
            assert backend.compiling
            assert backend.runs.count == captured_runs, "a call ran the captured graph"
    finally:
        release.set()
    trained.cache.wait_idle()
    with trained.scope():
        got += loop.run(1)  # compiled
    assert backend.runs.count == captured_runs + 1
    assert got == pytest.approx(expected, rel=1e-6)
    assert trained.calls_while_compiling["Model"] == 3 and trained.compiled_calls["Model"] == 1
    statuses = [row.status for row in rows]
    miss, compiling, hit = GroupStatus.MISS, GroupStatus.COMPILING, GroupStatus.HIT
    assert statuses == [miss, compiling, compiling, hit], statuses
