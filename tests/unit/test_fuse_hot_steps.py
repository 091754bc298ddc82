"""Hot optimizer steps (tpunb/fuse/hot/hotsteps.py): once a module's training calls are compiled
whole, the optimizer stepping its parameters runs ``step()`` compiled whole too, with
strict's numbers; a learning-rate schedule compiles no new graph once warm; a closure, a
scheduler made later and steps outside fused scopes keep working as PyTorch's own.

Each test starts from a reset Dynamo: what one compiled does not change what the next counts."""

from __future__ import annotations

import contextlib
import copy
import gc
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from tpunb.events import EventBus
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.config import HOT_AFTER, HOT_STEPS_AFTER
from tpunb.fuse.hot.hotsteps import HotStep

SYNC = FuseOptions(sync_compile=True, hot_training=True)
#: The first step (from 0) whose optimizer step runs compiled: the module is hot from its
#: HOT_AFTER-th call's optimizer step, whose eager step is the optimizer's first over plain
#: parameters, and the step after its HOT_STEPS_AFTER-th such step is compiled.
FIRST_COMPILED_STEP = HOT_AFTER - 1 + HOT_STEPS_AFTER
DATA = torch.randn(64, 12, generator=torch.Generator().manual_seed(5))
TARGET = torch.randn(64, 1, generator=torch.Generator().manual_seed(6))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make(lr: float = 1e-2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, index: int) -> float:
    rows = slice(index % 4 * 16, index % 4 * 16 + 16)
    optimizer.zero_grad()
    loss = F.mse_loss(model(DATA[rows]), TARGET[rows])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def scheduled_training(engine: FusionEngine | None, steps: int, graphs_at: int | None = None):
    """AdamW with StepLR and the lr also set by hand in every step's param groups, as minimal
    GPT scripts do; returns the losses, the model and Dynamo's graph count after ``graphs_at``."""
    model, optimizer = make()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    losses, graphs = [], None
    for index in range(steps):
        if engine is None:
            losses.append(step(model, optimizer, index))
        else:
            with engine.scope(SYNC, adopt=(model, optimizer)):
                losses.append(step(model, optimizer, index))
        scheduler.step()
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * (1 - index / 100)
        if index == graphs_at:
            graphs = counters["stats"]["unique_graphs"]
    return losses, model, graphs


def test_a_learning_rate_schedule_compiles_no_new_graph_once_warm():
    expected, strict_model, _ = scheduled_training(None, 20)
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    warm = FIRST_COMPILED_STEP + 3  # the first compiled steps: the lr a constant, then an input
    losses, model, graphs = scheduled_training(engine, 20, graphs_at=warm)
    assert counters["stats"]["unique_graphs"] == graphs, "a step after warm-up compiled a new graph"
    assert losses == pytest.approx(expected, rel=1e-5)
    for fused, strict in zip(model.parameters(), strict_model.parameters(), strict=True):
        torch.testing.assert_close(fused, strict, rtol=1e-5, atol=1e-6)
    steps = [g for g in bus.recent("group") if g.key == "AdamW-step"]
    assert len(steps) == 20 - FIRST_COMPILED_STEP, [g.status for g in steps]
    assert {g.status for g in steps[-(20 - warm - 1) :]} == {"hit"}
    assert steps[0].status == "miss" and steps[0].source.endswith(": optimizer.step()"), steps[0]


def closure_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """A step whose forward and backward run inside ``step()`` (Lightning's, LBFGS's way)."""

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(model(DATA[:16]), TARGET[:16])
        loss.backward()
        return loss

    return optimizer.step(closure).item()


def test_a_closure_step_and_steps_outside_fused_scopes_run_as_pytorch_runs_them():
    model, optimizer = make()
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(SYNC, adopt=(model, optimizer)):
        got = [step(model, optimizer, index) for index in range(FIRST_COMPILED_STEP + 1)]
    assert isinstance(optimizer.step, HotStep)
    graphs = counters["stats"]["unique_graphs"]
    with engine.scope(SYNC, adopt=(model, optimizer)):
        got += [closure_step(model, optimizer) for _ in range(3)]
    got += [step(model, optimizer, index) for index in range(3)]  # a strict cell
    assert counters["stats"]["unique_graphs"] == graphs  # neither compiled anything
    twin, twin_optimizer = make()
    expected = [step(twin, twin_optimizer, index) for index in range(FIRST_COMPILED_STEP + 1)]
    expected += [closure_step(twin, twin_optimizer) for _ in range(3)]
    expected += [step(twin, twin_optimizer, index) for index in range(3)]
    assert got == pytest.approx(expected, rel=1e-5)


def test_a_scheduler_made_after_the_step_turned_hot_still_schedules():
    model, optimizer = make(lr=0.1)
    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(SYNC, adopt=(model, optimizer)):
        for index in range(FIRST_COMPILED_STEP + 1):
            step(model, optimizer, index)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "optimizer.step() has been overridden" would fail
            scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
            for index in range(HOT_STEPS_AFTER + 2):
                step(model, optimizer, index)
                scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** (HOT_STEPS_AFTER + 2))
    assert isinstance(optimizer.step, HotStep)  # installed again around the scheduler's wrapper
    assert hasattr(optimizer.step, "_wrapped_by_lr_sched")


def test_past_dynamos_limit_of_step_versions_the_step_runs_eagerly_and_says_so():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    model, optimizer = make()
    with torch._dynamo.config.patch(recompile_limit=1):
        for index in range(FIRST_COMPILED_STEP + 3):
            if index == FIRST_COMPILED_STEP + 1:  # a new lr: a second version of the step
                optimizer.param_groups[0]["lr"] = 5e-3
            with engine.scope(SYNC, adopt=(model, optimizer)):
                step(model, optimizer, index)
    steps = [g for g in bus.recent("group") if g.key == "AdamW-step"]
    assert steps[0].status == "miss", [g.status for g in steps]
    assert steps[-1].status == "op by op" and "limit of 1 compiled versions" in steps[-1].miss_reason
    assert not isinstance(optimizer.__dict__.get("step"), HotStep)  # eager from then on


def test_an_optimizer_made_again_and_again_keeps_a_compiled_step():
    """A set-up cell run again makes a new optimizer of the same class: every one of them
    gets its step compiled, past Dynamo's 8 versions of the class's shared step frames."""
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    for _ in range(10):
        model, optimizer = make()
        with engine.scope(SYNC, adopt=(model, optimizer)):
            for index in range(FIRST_COMPILED_STEP + 2):
                step(model, optimizer, index)
        assert isinstance(optimizer.__dict__.get("step"), HotStep)
        last = [g for g in bus.recent("group") if g.key == "AdamW-step"][-1]
        assert last.status == "hit", (last.status, last.miss_reason)


def test_state_loaded_into_a_hot_optimizer_is_the_state_it_updates():
    """A checkpoint loaded mid-training (``load_state_dict`` replaces the state tensors the
    compiled step updated): the steps after it update the loaded state, as in strict mode."""

    def train(engine: FusionEngine | None) -> list[float]:
        model, optimizer = make()
        losses = []
        for index in range(FIRST_COMPILED_STEP + 6):
            if index == FIRST_COMPILED_STEP + 2:
                # (state_dict() returns references: a checkpoint is a copy, as torch.save makes)
                saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
            if index == FIRST_COMPILED_STEP + 4:  # back to the checkpoint
                model.load_state_dict(saved["model"])
                optimizer.load_state_dict(saved["optimizer"])
            scope = engine.scope(SYNC, adopt=(model, optimizer)) if engine else contextlib.nullcontext()
            with scope:
                losses.append(step(model, optimizer, index))
        return losses

    assert train(FusionEngine(torch.device("cpu"))) == pytest.approx(train(None), rel=1e-5)


def test_an_optimizer_that_is_gone_leaves_no_tensor_behind():
    """Dynamo keeps a compiled step's backend for the rest of the process; the graphs it made
    hold the optimizer's parameters and state, and are let go with the optimizer."""

    def trained() -> tuple[weakref.ref, weakref.ref]:
        model, optimizer = make()
        engine = FusionEngine(torch.device("cpu"))
        with engine.scope(SYNC, adopt=(model, optimizer)):
            for index in range(FIRST_COMPILED_STEP + 2):
                step(model, optimizer, index)
        assert isinstance(optimizer.step, HotStep)
        state = next(iter(optimizer.state.values()))["exp_avg"]
        return weakref.ref(next(model.parameters())), weakref.ref(state)

    parameter, state = trained()
    gc.collect()  # the optimizer goes, and its step's graphs are let go (a finalizer)
    gc.collect()  # and then what they held
    assert parameter() is None and state() is None
