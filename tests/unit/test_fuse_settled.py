"""Small ops on settled values run at once (tpunb/fuse/recording/settled.py): a loop's bookkeeping
around its model costs what eager does, while the user's own tensors, adopted state, group
results, big tensors and random draws record as before."""

from __future__ import annotations

import torch

from tpunb.events import EventBus
from tpunb.fuse import DeferredTensor, FuseOptions, FusionEngine
from tpunb.fuse.config import SMALL_NUMEL, TINY_OPS
from tpunb.fuse.recording.settled import TAG

REPLAY = FuseOptions(compile=False)


def engine_and_bus() -> tuple[FusionEngine, EventBus]:
    bus = EventBus()
    return FusionEngine(torch.device("cpu"), bus.publish), bus


def test_small_factories_and_what_follows_them_run_at_once():
    engine, bus = engine_and_bus()
    with engine.scope(REPLAY):
        positions = torch.arange(8)
        done = torch.full((2,), False)
        mask = (positions[None, :] < 5) | done[:, None]
        stop = bool(mask.all())
    assert type(mask) is torch.Tensor and getattr(mask, TAG)
    assert mask.tolist() == [[True] * 5 + [False] * 3] * 2 and stop is False
    assert bus.recent("group") == [] and engine.counts["recorded"] == 0


def test_the_users_tensors_adopted_state_and_random_draws_still_record():
    engine, bus = engine_and_bus()
    data = torch.randn(4, 8)  # made outside the engine: the user's
    layer = torch.nn.Linear(8, 2)
    with engine.scope(REPLAY, adopt=(layer,)):
        scaled = data * 2
        out = layer(torch.ones(4, 8))  # a small factory, but read with adopted weights
        noise = torch.rand(3)
    for value in (scaled, out, noise):
        assert type(value) is DeferredTensor
    assert len(bus.recent("group")) == 1
    torch.testing.assert_close(scaled.materialized(), data * 2)


def test_big_factories_and_group_results_keep_recording():
    engine, bus = engine_and_bus()
    with engine.scope(REPLAY):
        big = torch.ones(SMALL_NUMEL + 1) + 1
        head = big[:4] * 3
        head.sum().item()  # flushes: head is a group's result from here on
        again = head * 2
    assert type(big) is DeferredTensor and type(again) is DeferredTensor
    assert again.materialized().tolist() == [12.0] * 4
    assert len(bus.recent("group")) == 2


def test_a_big_factory_runs_at_once_as_an_eager_result_and_what_reads_it_records():
    engine, bus = engine_and_bus()
    with engine.scope(REPLAY):
        big = torch.zeros(SMALL_NUMEL + 1)
        assert type(big) is DeferredTensor and big.pending is None  # made, not recorded
        out = big + 1
        assert out.pending is not None
    assert out.materialized().sum().item() == SMALL_NUMEL + 1
    assert len(bus.recent("group")) == 1


def test_a_tiny_groups_results_are_settled_a_bigger_groups_go_on_recording():
    """A tiny group never compiles (config.TINY_OPS): its results are as good as an eager op's."""
    engine, _ = engine_and_bus()
    x = torch.randn(8)
    with engine.scope(REPLAY):
        doubled = x * 2
        doubled.sum().item()  # flushes a group of 2 ops
        after_tiny = doubled + 1
        chain = x
        for _ in range(TINY_OPS):
            chain = chain * 1.5
        chain.sum().item()  # flushes a group of TINY_OPS + 1 ops
        after_chain = chain + 1
    assert type(after_tiny) is torch.Tensor and getattr(after_tiny, TAG)  # ran at once
    assert type(after_chain) is DeferredTensor  # recorded: its computation goes on
    torch.testing.assert_close(after_tiny, x * 2 + 1)
    torch.testing.assert_close(after_chain.materialized(), x * 1.5**TINY_OPS + 1)


def test_writes_into_settled_values_keep_their_rules():
    engine, _ = engine_and_bus()
    with engine.scope(REPLAY):
        counts = torch.zeros(3, dtype=torch.long)
        pending = torch.randn(3).abs()  # random: recorded, pending
        counts += 1
        counts[1] = 7
        both = pending * counts  # reads the written settled value
    both, pending = (t.materialized() if type(t) is DeferredTensor else t for t in (both, pending))
    torch.testing.assert_close(both, pending * torch.tensor([1.0, 7.0, 1.0]))
    assert counts.tolist() == [1, 7, 1]


def test_a_training_step_on_a_tiny_model_still_fuses():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    engine, bus = engine_and_bus()
    for net, opt, scope in ((model, optimizer, True), (twin, twin_optimizer, False)):
        for _ in range(3):
            with engine.scope(REPLAY, adopt=(net, opt)) if scope else torch.enable_grad():
                loss = torch.nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()
    assert len(bus.recent("group")) == 3  # one group a step: forward, backward and update
    torch.testing.assert_close(model[0].weight.materialized(), twin[0].weight)
