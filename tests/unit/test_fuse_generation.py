"""Greedy generation in fused mode: HF ``generate()`` with a static and a dynamic KV cache, on
a Llama-style and a GPT-2-style model, gives strict's tokens; with the static cache the decode
steps settle into the same groups, so the number of distinct groups stays bounded however
many tokens are generated. Groups replay here (``compile=False``); one run compiles."""

from __future__ import annotations

import pytest
import torch

from benchmarks.generate import build, generate_call
from tpunb.events import EventBus
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.config import GROWING_AFTER
from tpunb.fuse.recording.growing import GrowingInputs, steady_growth
from tpunb.fuse.recording.trace import Trace

REPLAY = FuseOptions(compile=False)


def prompt(model) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(3, model.config.vocab_size, (2, 8))


def fused_generation(model, cache: str, new_tokens: int, options: FuseOptions = REPLAY):
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    call = generate_call(model, prompt(model), cache, new_tokens)
    with engine.scope(options, adopt=(model,)):
        out = call()
    return out.materialized() if hasattr(out, "materialized") else out, bus.recent("group"), engine


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_tokens_equal_strict(name, cache):
    model = build(name)
    expected = generate_call(model, prompt(model), cache, 12)()
    tokens, groups, _ = fused_generation(model, cache, 12)
    assert torch.equal(tokens, expected)
    assert len(groups) >= 12  # it ran deferred: a group per step at least


def test_static_cache_steps_settle_into_the_same_groups():
    model = build("llama")
    _, short, _ = fused_generation(model, "static", 8)
    _, long, engine = fused_generation(model, "static", 24)
    # 16 more tokens add groups but no new kinds of group: each decode step repeats the last
    assert len({g.key for g in long}) == len({g.key for g in short})
    assert engine.growing.locations  # the token history's readers run outside groups
    steady = max({g.key: sum(h.key == g.key for h in long) for g in long}.values())
    assert steady >= 24 - GROWING_AFTER - 2


def test_a_compiled_static_cache_generation_compiles_what_repeats_and_then_hits():
    """As in a notebook: groups compile in the background once they come back."""
    model = build("llama")
    expected = generate_call(model, prompt(model), "static", 16)()
    engine = FusionEngine(torch.device("cpu"))
    call = generate_call(model, prompt(model), "static", 16)
    results = []
    for _ in range(2):
        with engine.scope(FuseOptions(compile_after_s=0), adopt=(model,)):
            results.append(call())
        engine.cache.wait_idle()
    assert all(torch.equal(out, expected) for out in results)
    counters = engine.cache.snapshot()
    assert counters["compiles"] <= 12  # the decode step's groups and the prefill's, not one per token
    assert counters["hits"] >= 16  # the second call's decode steps ran compiled


def trace_reading(shape: tuple, wrapped: bool = True) -> Trace:
    """A trace whose one op (at a fixed place in this file) reads one input of ``shape``:
    an earlier result of the engine (``wrapped``), or data from outside."""
    from tpunb.fuse.recording.trace import OpRecord

    trace = Trace()
    ref = trace.input_ref(torch.zeros(shape), wrapped)
    trace.ops.append(OpRecord(torch.ops.aten.cat.default, ((ref,),), {}, False, None, 7, (), None))
    return trace


def test_steady_growth_marks_the_reader_and_varying_sizes_do_not():
    growing = GrowingInputs()
    previous = trace_reading((2, 8))
    for length in range(9, 9 + GROWING_AFTER):
        current = trace_reading((2, length))
        growing.observe(tuple(previous.input_metas), current)
        previous = current
    assert growing.covers(torch.ops.aten.cat.default, None, 7)
    batches = GrowingInputs()
    previous = trace_reading((32, 5))
    for length in (9, 7, 12, 30, 16, 8):  # dynamic padding: sizes change, but not steadily
        current = trace_reading((32, length))
        batches.observe(tuple(previous.input_metas), current)
        previous = current
    assert not batches.locations
    sorted_batches = GrowingInputs()  # data batched by length grows steadily, but is not fed back
    previous = trace_reading((32, 4), wrapped=False)
    for length in range(5, 5 + 2 * GROWING_AFTER):
        current = trace_reading((32, length), wrapped=False)
        sorted_batches.observe(tuple(previous.input_metas), current)
        previous = current
    assert not sorted_batches.locations
    assert steady_growth((2, 8), (2, 9)) == (0, 1) and steady_growth((2, 9), (2, 8)) is None
    assert steady_growth((4, 8), (5, 9)) is None
