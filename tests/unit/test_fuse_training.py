"""Training loops in fused mode equal strict mode, with a bounded number of compiled graphs.

These compile with Inductor (seconds per graph), so they are few and small.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from tpunb.events import EventBus
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.config import SMALL_NUMEL, TINY_OPS

#: The recorder's own groups, compiled: training calls are not compiled whole here
#: (tests/unit/test_fuse_hot_training.py has those).
COMPILED = FuseOptions(sync_compile=True, hot_training=False)
REPLAY = FuseOptions(compile=False)


#: Elements of a tensor too big for a tiny group (config.TINY_OPS): groups on it compile.
WIDE = 2 * SMALL_NUMEL


def make_model(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(32, 4)
    )


def train(model, opt, data, labels, steps: int, schedule=None) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
    return losses


def batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(32, 16, generator=generator), torch.randint(0, 4, (32,), generator=generator)


@pytest.mark.parametrize(
    ("name", "make_opt", "options", "dropout"),
    [
        ("sgd-momentum", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), REPLAY, 0.0),
        ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-2), REPLAY, 0.0),
        ("adamw-dropout", lambda p: torch.optim.AdamW(p, lr=1e-2), REPLAY, 0.3),
        ("adamw-compiled", lambda p: torch.optim.AdamW(p, lr=1e-2), COMPILED, 0.0),
        ("sgd-dropout-compiled", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), COMPILED, 0.3),
    ],
)
def test_fused_training_equals_strict(name, make_opt, options, dropout):
    data, labels = batch()
    strict_model = make_model(dropout)
    fused_model = copy.deepcopy(strict_model)
    strict_opt, fused_opt = make_opt(strict_model.parameters()), make_opt(fused_model.parameters())
    torch.manual_seed(5)
    expected = train(strict_model, strict_opt, data, labels, steps=8)
    engine = FusionEngine(torch.device("cpu"), EventBus().publish)
    torch.manual_seed(5)
    with engine.scope(options, adopt=(fused_model, fused_opt)):
        got = train(fused_model, fused_opt, data, labels, steps=8)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for fused_p, strict_p in zip(fused_model.parameters(), strict_model.parameters(), strict=True):
        torch.testing.assert_close(fused_p.detach(), strict_p.detach(), rtol=1e-4, atol=1e-5)
    assert engine.groups == 8  # one group per step: forward + backward + update


def test_compiled_dropouts_draw_the_eager_numbers_after_layer_norm_and_batch_norm():
    """Dropout's mask is a fresh buffer filled in place; Inductor, left alone, multiplied by
    the buffer before filling it (NaN after a LayerNorm). Several dropouts also check that
    compiled fills draw in eager's order."""
    torch.manual_seed(0)
    text = torch.nn.Sequential(
        torch.nn.LayerNorm(64, eps=1e-12),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 64),
        torch.nn.Dropout(0.3),
    )
    image = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Dropout2d(0.2), torch.nn.Dropout(0.1)
    )
    # big enough for groups that compile (a tiny one would not: config.TINY_OPS)
    inputs = {text: torch.randn(8, 128, 64), image: torch.randn(2, 3, 64, 64)}
    engine = FusionEngine(torch.device("cpu"))
    for model, x in inputs.items():
        model.train()
        for seed in (1, 2):  # a miss (compiled synchronously, then run) and a hit
            torch.manual_seed(seed)
            expected = model(x)
            torch.manual_seed(seed)
            with engine.scope(COMPILED, adopt=(model,)):
                got = model(x)
            torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-5)
            assert torch.equal(got == 0, expected == 0)  # the same elements dropped
    assert engine.stats()["hits"] == 2 and engine.stats()["failures"] == 0


def test_fifty_adamw_steps_with_a_schedule_compile_at_most_three_graphs():
    data, labels = batch()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    with engine.scope(COMPILED, adopt=(model, opt)):
        losses = train(model, opt, data, labels, steps=50, schedule=schedule)
    assert losses[-1] < losses[0] * 0.5
    stats = engine.stats()
    assert stats["graphs"] <= 3, stats
    assert stats["hits"] >= 47
    statuses = [g.status for g in bus.recent("group")]
    assert statuses[-1] == "hit" and statuses.count("miss") <= 3
    assert bus.recent("group")[-1].lifted > 0  # bias corrections and the LR ride as inputs


def test_a_group_compiles_in_the_background_on_its_second_sighting():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    x = torch.randn(WIDE)
    expected = float((x * 2 + 1).relu().sum())
    results = []
    for _ in range(3):
        with engine.scope(FuseOptions()):
            results.append((x * 2 + 1).relu().sum().item())
        engine.cache.wait_idle()
        if len(results) == 1:
            assert engine.stats()["compiles"] == 0  # seen once: replayed, nothing compiled
    assert results == pytest.approx([expected] * 3, rel=1e-6)
    assert [g.status for g in bus.recent("group")] == ["miss", "compiling", "hit"]
    stats = engine.stats()
    assert (stats["misses"], stats["hits"], stats["compiles"]) == (1, 1, 1)
    assert bus.recent("compile")[-1].ok


def test_a_tiny_group_runs_op_by_op_and_never_compiles():
    """A few ops on small tensors (generate()'s checks of its prompt, say) run in tens of
    microseconds op by op: a compile of a second or more would never pay for itself."""
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    x = torch.randn(SMALL_NUMEL)
    expected = float((x * 2 + 1).relu().sum())
    for _ in range(3):
        with engine.scope(COMPILED):  # compile at once, were it worth it
            assert (x * 2 + 1).relu().sum().item() == pytest.approx(expected)
    assert [g.status for g in bus.recent("group")] == ["miss", "op by op", "op by op"]
    assert engine.stats()["compiles"] == 0


def test_floats_that_vary_by_the_second_sighting_are_lifted_before_the_only_compile():
    engine = FusionEngine(torch.device("cpu"))
    x = torch.randn(WIDE)
    for step in range(1, 5):
        with engine.scope(FuseOptions()):
            (x * (1 - 0.9**step)).sum().item()  # a bias correction: a new float every step
        engine.cache.wait_idle()
    stats = engine.stats()
    assert (stats["compiles"], stats["hits"]) == (1, 2), stats


def test_a_compile_failure_is_remembered_and_the_group_replays(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module

    def broken(*args, **kwargs):
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(compile_fx_module, "compile_fx", broken)
    engine = FusionEngine(torch.device("cpu"), EventBus().publish)
    x = torch.randn(WIDE)
    with pytest.warns(RuntimeWarning, match="inductor exploded"):
        for _ in range(3):
            with engine.scope(COMPILED):
                y = x * 3
            torch.testing.assert_close(y.materialized(), x * 3)
    stats = engine.stats()
    assert stats["failures"] == 1 and stats["misses"] == 1 and stats["graphs"] == 1


def test_a_shape_storm_stops_compiling_and_warns():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    with pytest.warns(RuntimeWarning, match="compiled for 8 different input shapes"):
        for size in range(1, 13):
            ones = torch.ones(size, WIDE)  # made outside: a small factory inside would run at once
            with engine.scope(COMPILED):
                y = (ones * 2 + 1).sum()
            assert y.materialized().item() == 3.0 * size * WIDE
    stats = engine.stats()
    assert stats["compiles"] == 8 and stats["graphs"] == 12
    assert [g.status for g in bus.recent("group")][-4:] == ["miss"] * 4
    # the fix, one padded shape, still ends in compiled steps: a shape that keeps coming back compiles
    padded = torch.ones(16, WIDE)
    for _ in range(4):
        with engine.scope(COMPILED):
            (padded * 2 + 1).sum().materialized()
    assert [g.status for g in bus.recent("group")][-4:] == ["miss", "op by op", "hit", "hit"]
    assert engine.stats()["compiles"] == 9


def test_a_miss_says_what_changed_since_the_same_ops_last_ran():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    for rows in (64, 64, 17):
        with engine.scope(REPLAY):
            (torch.randn(rows, 3) * 2).sum().item()  # random: recorded however small (settled.py)
    reasons = [g.miss_reason for g in bus.recent("group")]
    assert reasons[0] is None and reasons[1] is None
    assert reasons[2] == "arguments of op #0 changed (a shape, size or constant)"
    x64, x17 = torch.randn(64, 3), torch.randn(17, 3)
    for x in (x64, x17):
        with engine.scope(REPLAY):
            (x * 2).relu().sum().item()
    assert bus.recent("group")[-1].miss_reason == "input 0 shape changed [64, 3] → [17, 3]"


def test_batches_drawn_from_one_dataset_share_a_compiled_group():
    """A DataLoader indexes its dataset sample by sample and stacks the samples: the indices
    change every batch, and so do the samples' offsets in the dataset's storage. Neither may
    change the group's key, or every batch would be a new compile."""
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(256, 16, generator=generator)
    targets = torch.randint(0, 4, (256,), generator=generator)
    dataset = torch.utils.data.TensorDataset(features, targets)

    def six_batches():
        order = torch.Generator().manual_seed(4)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=8, shuffle=True, drop_last=True, generator=order
        )
        return itertools.islice(loader, 6)

    strict_model = make_model()
    model = copy.deepcopy(strict_model)
    strict_opt = torch.optim.SGD(strict_model.parameters(), lr=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    expected = [step_on(strict_model, strict_opt, x, y) for x, y in six_batches()]
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    with engine.scope(COMPILED, adopt=(model, opt)):
        got = [step_on(model, opt, x, y) for x, y in six_batches()]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert [g.status for g in bus.recent("group")][2:] == ["hit"] * 4
    assert engine.stats()["graphs"] <= 2
    assert engine.counts["bookkeeping"] > 0  # the dataset's per-sample views ran as plain views


def step_on(model, opt, x, y) -> float:
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def test_adopting_inside_a_fused_block_after_strict_steps():
    """The pattern of a notebook that trains a few steps in strict mode, then switches to
    fused and adopts the same model and optimizer (whose state now exists)."""
    data, labels = batch()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    strict_model = copy.deepcopy(model)
    strict_opt = torch.optim.AdamW(strict_model.parameters(), lr=1e-2)
    expected = train(strict_model, strict_opt, data, labels, steps=4)
    engine = FusionEngine(torch.device("cpu"), EventBus().publish)
    engine.adopt(model, opt)  # as tpunb.adopt() in a script, before any fused block
    got = train(model, opt, data, labels, steps=2)
    with engine.scope(REPLAY):
        engine.adopt(model, opt)
        got += train(model, opt, data, labels, steps=2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_groups_stay_aligned_with_steps_when_a_step_is_longer_than_a_group():
    """A step longer than ``max_ops`` is cut into chunks; when the loss was computed by the
    first chunk, ``loss.item()`` needs no flush, and without one the chunk boundaries would
    drift from step to step and never repeat a key. Reading a group's result ends the group."""
    data, labels = batch()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    with engine.scope(FuseOptions(sync_compile=True, max_ops=40, hot_training=False), adopt=(model, opt)):
        train(model, opt, data, labels, steps=8)
    groups = bus.recent("group")
    per_step = len(groups) // 8
    assert len(groups) == 8 * per_step and per_step >= 2
    last_step = [(g.key, g.status) for g in groups[-per_step:]]
    assert [g.key for g in groups[-2 * per_step : -per_step]] == [key for key, _ in last_step]
    # every group hits but a tiny tail (a few ops on this small model), which runs op by op
    assert all(
        g.status == "hit" or (g.status == "op by op" and g.ops <= TINY_OPS) for g in groups[-per_step:]
    ), last_step
    assert any(status == "hit" for _, status in last_step)


def test_background_compiles_never_run_fx_symbolic_tracing(monkeypatch):
    """FX's symbolic tracer patches nn.Module.__call__ for every thread while it runs: on the
    compile worker it would capture the user's module calls on the main thread."""
    import threading

    from torch._inductor.loop_body import InterpreterShim

    InterpreterShim._dummy_gm.cache_clear()  # as in a fresh process
    tracers = []
    original = torch.fx.Tracer.trace

    def recording_trace(self, *args, **kwargs):
        tracers.append((type(self) is torch.fx.Tracer, threading.current_thread().name))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Tracer, "trace", recording_trace)
    engine = FusionEngine(torch.device("cpu"))
    x = torch.randn(WIDE)
    for _ in range(2):
        with engine.scope(FuseOptions()):
            (x.tanh() * 3).sum().item()
    engine.cache.wait_idle()
    assert engine.stats()["compiles"] == 1
    assert not [name for plain, name in tracers if plain and name.startswith("tpunb-compile")], tracers


class LstmClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = torch.nn.LSTM(16, 16, num_layers=2), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x.view(4, 8, 16))[0].mean(0).repeat(4, 1))


def test_an_lstm_trains_as_in_strict():
    """mkldnn's LSTM layer returns an empty workspace on meta tensors and a real one when it
    runs: recorded, its backward was handed the empty one and failed (meta.SIZED_WHEN_RUN)."""
    data, labels = batch()
    torch.manual_seed(0)
    strict_model = LstmClassifier()
    fused_model = copy.deepcopy(strict_model)
    make_opt = lambda model: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    expected = train(strict_model, make_opt(strict_model), data, labels, steps=3)
    engine = FusionEngine(torch.device("cpu"), EventBus().publish)
    fused_opt = make_opt(fused_model)
    with engine.scope(REPLAY, adopt=(fused_model, fused_opt)):
        got = train(fused_model, fused_opt, data, labels, steps=3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
