"""Hot module calls (tpunb/fuse/hot/hotcalls.py): a module called again and again without grad in
eval mode is compiled whole by Dynamo and Inductor in fused scopes. Generation gives strict's
tokens with a bounded number of graphs; the mixed regimes stay recorded (training calls are
test_fuse_hot_training.py's); adopted tensors are released in place and adopted again later;
calls Dynamo runs uncompiled say so."""

from __future__ import annotations

import copy
import pickle
import threading
import time

import pytest
import torch
from torch._dynamo.utils import counters

from benchmarks.generate import build, generate_call
from tpunb.events import OPTIMIZER_STEP_SUFFIX, EventBus, GroupStatus
from tpunb.fuse import DeferredTensor, FuseOptions, FusionEngine
from tpunb.fuse.config import HOT_AFTER
from tpunb.fuse.groups.plan import Regime
from tpunb.fuse.groups.worker import COMPILER_BUSY
from tpunb.fuse.hot.hotcalls import HotCall

# groups compile in the background, hot calls and steps from their first hot run: as in a notebook
# whose loop has run long enough for their compiles to pay off (plan.compile_pays_off)
BACKGROUND = FuseOptions(compile_after_s=0)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # another test's graphs would count against Dynamo's recompile limit
    yield
    torch._dynamo.reset()


def prompt(model) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(3, model.config.vocab_size, (2, 8))


def whole_calls(bus: EventBus, kind: str = "-whole") -> list:
    """The records of hot calls of one kind: no-grad ("-whole") or training ("-training")."""
    return [g for g in bus.recent("group") if g.key.endswith(kind)]


@pytest.mark.parametrize(("name", "cache"), [("llama", "static"), ("llama", "dynamic"), ("gpt2", "static")])
def test_generation_compiles_the_model_whole_and_gives_strict_tokens(name, cache):
    model = build(name)
    expected = generate_call(model, prompt(model), cache, 16)()
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    call = generate_call(model, prompt(model), cache, 16)
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(3):
        published = bus.count("group")
        with engine.scope(BACKGROUND, adopt=(model,)):
            tokens = call()
        assert torch.equal(tokens, expected)
    # the loop around the model (logits processors, stopping criteria, positions) ran as
    # eager PyTorch, unrecorded (aside.py, settled.py): besides the model's calls, the last run recorded only
    # generate's checks of the prompt and mask the caller passed, once per call, not per token
    last_run = bus.recent("group")[published - bus.count("group") :]
    others = [group for group in last_run if not group.key.endswith("-whole")]
    assert len(others) <= 6, [group.trigger for group in others]
    assert isinstance(model._compiled_call_impl, HotCall)
    runs = whole_calls(bus)
    # every call after the first HOT_AFTER ran compiled (the second compiled the prefill,
    # which the first recorded); the third hits, but for a recompile Dynamo sometimes makes
    # of the prefill's cache layout (seen in about one run of three, dynamic cache)
    assert len(runs) == 3 * 16 - HOT_AFTER
    assert [run.status for run in runs[-16:]].count("hit") >= 14
    compiled = counters["stats"]["unique_graphs"] - graphs
    assert 1 <= compiled <= (3 if cache == "static" else 5), compiled  # prefill, decode (, dynamic length)
    # and nothing else compiled: not the groups the model's first calls recorded (they do not
    # come back once it is hot), nor generate's checks (tiny groups)
    engine.cache.wait_idle()
    assert engine.stats()["compiles"] == compiled


def test_a_hand_written_decode_loop_is_compiled_whole():
    from transformers import StaticCache

    model = build("llama")
    ids = prompt(model)

    def decode(steps: int) -> torch.Tensor:
        cache = StaticCache(config=model.config, max_cache_len=32)
        tokens, positions = ids, torch.arange(ids.shape[1])
        with torch.no_grad():
            logits = model(tokens, past_key_values=cache, cache_position=positions).logits
            for _ in range(steps):
                next_token = logits[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, next_token], dim=1)
                positions = positions[-1:] + 1
                logits = model(next_token, past_key_values=cache, cache_position=positions).logits
        return tokens

    expected = decode(10)
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    with engine.scope(BACKGROUND, adopt=(model,)):
        tokens = decode(10)
    assert torch.equal(tokens.materialized() if isinstance(tokens, DeferredTensor) else tokens, expected)
    assert len(whole_calls(bus)) == 11 - HOT_AFTER  # the calls after the HOT_AFTER-th


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_calls_in_the_mixed_regimes_stay_recorded():
    """Grad in eval mode (a frozen-statistics fine-tune) and no grad in train mode (batch
    norm statistics without a backward) are neither regime a hot call compiles for."""
    model = small_model()
    engine = FusionEngine(torch.device("cpu"))
    x = torch.randn(2, 8)
    with engine.scope(BACKGROUND, adopt=(model,)):
        with torch.no_grad():
            for _ in range(HOT_AFTER + 2):
                model(x)  # train mode without grad: recorded
        model.eval()
        for _ in range(HOT_AFTER + 2):
            model(x).sum().backward()  # grad in eval mode: recorded
    assert model._compiled_call_impl is None
    assert engine.counts["recorded"] + engine.counts["followed"] > 0


def test_with_hot_training_off_training_calls_stay_recorded():
    model = small_model()
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(FuseOptions(hot_training=False), adopt=(model,)):
        for _ in range(HOT_AFTER + 2):
            model(torch.randn(2, 8)).sum().backward()  # recorded, so backward fuses with it
    assert model._compiled_call_impl is None


def test_only_outermost_calls_count():
    model = small_model().eval()
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(BACKGROUND, adopt=(model,)), torch.no_grad():
        for _ in range(HOT_AFTER):
            model(torch.randn(2, 8))
    assert isinstance(model._compiled_call_impl, HotCall)
    assert all(layer._compiled_call_impl is None for layer in model)  # called inside it only


@pytest.mark.parametrize("options", [FuseOptions(), BACKGROUND], ids=["eager until paid for", "compiled"])
def test_a_hot_module_called_inside_another_hot_modules_call(options):
    """A layer used on its own turns hot first; then the model around it does, and its calls
    call the layer's hot call, with tpunb's module hooks already lifted by the model's."""
    model = small_model().eval()
    layer = model[0]
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x), layer(x)
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(options, adopt=(model,)), torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            got_layer = layer(x)
        for _ in range(HOT_AFTER + 2):
            got = model(x)
        later_layer = layer(x)  # the hooks came back after the nested calls
    assert isinstance(model._compiled_call_impl, HotCall) and isinstance(layer._compiled_call_impl, HotCall)
    torch.testing.assert_close(got, expected[0])
    torch.testing.assert_close(got_layer, expected[1])
    torch.testing.assert_close(later_layer, expected[1])
    assert torch.nn.modules.module._global_forward_pre_hooks == {}  # none left behind


def test_calls_made_on_another_thread_during_a_fused_scope_are_not_the_scopes():
    """The scope's module hooks are global; a module called on another thread meanwhile (a
    compile worker tracing a graph module, a user's loader thread) is not counted, and does not
    turn hot (it would have after HOT_AFTER calls on the notebook thread)."""
    model = small_model().eval()
    engine = FusionEngine(torch.device("cpu"))

    def evaluate() -> None:
        with torch.no_grad():
            for _ in range(HOT_AFTER + 2):
                model(torch.randn(2, 8))

    with engine.scope(BACKGROUND):
        worker = threading.Thread(target=evaluate)
        worker.start()
        worker.join()
    assert model._compiled_call_impl is None
    with engine.scope(BACKGROUND):
        evaluate()  # the same calls on the scope's thread
    assert isinstance(model._compiled_call_impl, HotCall)


def test_hot_calls_and_steps_never_wait_for_the_compile_worker():
    """While the worker holds the compiler (a group's compile, a model's backward: up to a
    minute), a hot training call or optimizer step that would compile runs as it is, at once,
    with strict's answers, and says why in its row; it compiles at a later call."""
    from torch._dynamo.convert_frame import compile_lock

    model, reference = small_model(), small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    x, y = torch.randn(16, 8), torch.randn(16, 4)

    def step(m: torch.nn.Module, o: torch.optim.Optimizer) -> float:
        loss = torch.nn.functional.mse_loss(m(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.item()

    holding, release = threading.Event(), threading.Event()
    waited: list[bool] = []

    def worker_compiling() -> None:  # as the worker does for a whole compile
        with compile_lock:
            holding.set()
            waited.append(not release.wait(60))  # True: the notebook thread blocked meanwhile

    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    holder = threading.Thread(target=worker_compiling)
    holder.start()
    holding.wait(10)
    try:
        with engine.scope(BACKGROUND, adopt=(model, optimizer)):
            losses = [step(model, optimizer) for _ in range(HOT_AFTER + 3)]
    finally:
        release.set()
        holder.join()
    assert waited == [False]
    busy = whole_calls(bus, "-training") + whole_calls(bus, OPTIMIZER_STEP_SUFFIX)
    assert {g.key for g in busy} == {"Sequential-training", "AdamW" + OPTIMIZER_STEP_SUFFIX}, busy
    waiting = (GroupStatus.OP_BY_OP, COMPILER_BUSY, None)
    assert all((g.status, g.plan, g.miss_reason) == waiting for g in busy), busy
    # they asked nothing of the cache: its counters hold the recorded groups only
    assert engine.cache.counters.requests == len(bus.recent("group")) - len(busy)
    engine.cache.wait_idle()  # the groups recorded meanwhile compile: the compiler is free
    with engine.scope(BACKGROUND, adopt=(model, optimizer)):
        losses += [step(model, optimizer) for _ in range(3)]
    later = whole_calls(bus, "-training")[len(whole_calls(bus, "-training")) - 3 :]
    assert later[0].status == GroupStatus.MISS, later
    assert losses == pytest.approx([step(reference, reference_optimizer) for _ in losses], rel=1e-5)


def test_with_sync_compile_a_hot_call_waits_for_the_worker_and_compiles():
    """``--sync-compile`` asks for compiled code at once: a hot call that meets the worker
    compiling waits for the compiler, then compiles (a miss, not a run as it is)."""
    from torch._dynamo.convert_frame import compile_lock

    model = small_model().eval()
    holding = threading.Event()

    def worker_compiling() -> None:
        with compile_lock:
            holding.set()
            time.sleep(0.5)

    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    x = torch.randn(2, 8)
    with engine.scope(FuseOptions(sync_compile=True)), torch.no_grad():
        for _ in range(HOT_AFTER):
            model(x)
        holder = threading.Thread(target=worker_compiling)
        holder.start()
        holding.wait(10)
        out = model(x)
    holder.join()
    [call] = whole_calls(bus)
    assert call.status == GroupStatus.MISS, call
    assert call.miss_reason is None  # a first compile is no recompile (the monitor's "last recompile")
    torch.testing.assert_close(out, small_model().eval()(x))


@pytest.mark.parametrize("hot_training", [True, False])
def test_a_hot_module_releases_its_tensors_and_trains_after_evaluating(hot_training):
    """Evaluated until hot, then trained: compiled whole for training too (its parameters stay
    plain and the optimizer steps them as eager PyTorch), or, with hot training off, recorded
    (reading the parameters as they are where Dynamo's compiled code holds them, which
    ``swap_tensors`` then refuses to adopt). Either way the step gives strict's weights."""
    model = small_model().eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    weight = model[0].weight
    x = torch.randn(2, 8)
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(FuseOptions(hot_training=hot_training), adopt=(model, optimizer)):
        with torch.no_grad():
            outs = [model(x) for _ in range(HOT_AFTER + 2)]
        assert type(weight) is torch.nn.Parameter and model[0].weight is weight  # released in place
        model.train()
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
    if hot_training:  # compiled whole for training too: never adopted again
        assert type(weight) is torch.nn.Parameter
    with torch.no_grad():
        expected = reference(x)
    for out in outs:
        torch.testing.assert_close(out.materialized() if isinstance(out, DeferredTensor) else out, expected)
    reference(x).sum().backward()
    reference_optimizer.step()
    trained = weight.materialized() if isinstance(weight, DeferredTensor) else weight
    torch.testing.assert_close(trained, reference[0].weight)


def test_outside_fused_scopes_a_hot_module_runs_its_own_call():
    model = small_model().eval()
    engine = FusionEngine(torch.device("cpu"))
    x = torch.randn(2, 8)
    with engine.scope(BACKGROUND, adopt=(model,)), torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            model(x)
    graphs = counters["stats"]["unique_graphs"]
    calls = []
    hook = model.register_forward_hook(lambda module, args, out: calls.append(1))
    with torch.no_grad():
        out = model(x)
    hook.remove()
    assert calls == [1] and counters["stats"]["unique_graphs"] == graphs
    assert type(out) is torch.Tensor
    pickle.dumps(model)  # nn.Module drops its compiled call when pickled
    assert copy.deepcopy(model)._compiled_call_impl is None


def test_compiling_off_keeps_every_call_recorded():
    model = small_model().eval()
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(FuseOptions(compile=False), adopt=(model,)), torch.no_grad():
        for _ in range(HOT_AFTER + 2):
            model(torch.randn(2, 8))
    assert model._compiled_call_impl is None


def test_a_module_dynamo_fails_on_is_recorded_from_then_on(monkeypatch):
    from torch._dynamo.exc import InternalTorchDynamoError

    def broken(*args, **kwargs):
        raise InternalTorchDynamoError("dynamo exploded")

    model = small_model().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x)
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(BACKGROUND, adopt=(model,)), torch.no_grad():
        for _ in range(HOT_AFTER):
            model(x)
        monkeypatch.setattr(model._compiled_call_impl.code(Regime.INFERENCE), "compiled", broken)
        with pytest.warns(RuntimeWarning, match="dynamo exploded"), pytest.raises(InternalTorchDynamoError):
            model(x)
        recorded = engine.counts["recorded"] + engine.counts["followed"]
        outs = [model(x) for _ in range(HOT_AFTER + 1)]  # never hot again
        assert model._compiled_call_impl is None
        assert engine.counts["recorded"] + engine.counts["followed"] > recorded
    for out in outs:
        torch.testing.assert_close(out.materialized() if isinstance(out, DeferredTensor) else out, expected)


def test_calls_past_dynamos_recompile_limit_run_uncompiled_and_say_so():
    """A new batch size every step: past Dynamo's limit of compiled versions (lowered to 2
    here) a hot training call runs as it is, uncompiled, with strict's answers; its record
    says so (``eager``, and why), and the cache counts a miss, never a hit (its hits are the
    optimizer's steps: hotsteps.py)."""
    model, twin = small_model(), small_model()
    opt, twin_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)

    def step(m: torch.nn.Module, o: torch.optim.Optimizer, n: int) -> float:
        loss = m(torch.arange(n * 8.0).reshape(n, 8) / 50).square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss.item()

    sizes = range(1, HOT_AFTER + 5)  # the calls after the HOT_AFTER-th are hot
    with (
        torch._dynamo.config.patch(recompile_limit=2),
        engine.scope(FuseOptions(sync_compile=True, hot_training=True), adopt=(model, opt)),
    ):
        losses = [step(model, opt, n) for n in sizes]
    assert losses == pytest.approx([step(twin, twin_opt, n) for n in sizes], rel=1e-5)
    records = whole_calls(bus, "-training")
    assert [r.status for r in records] == ["miss", "miss", "op by op", "op by op"], records
    assert records[0].miss_reason is None and "shape" in records[1].miss_reason  # then a recompile
    assert records[-1].miss_reason.startswith("run uncompiled: Dynamo's limit of 2 compiled versions")
    assert "shape" in records[-1].miss_reason
    step_hits = [r for r in whole_calls(bus, "-step") if r.status == "hit"]  # the SGD steps compile
    assert engine.stats()["hits"] == len(step_hits)  # the training calls never hit
