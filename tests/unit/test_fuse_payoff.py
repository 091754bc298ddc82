"""A hot call's or step's compile: run eagerly until it pays off, and eagerly again for good if
its compiled runs prove slower than its eager ones (fuse/payoff.py, plan.py's rules)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tpunb.events import FusionGroup
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.hotcalls import UNTIL_PAID_FOR
from tpunb.fuse.payoff import Payoff
from tpunb.fuse.plan import COMPARED_RUNS, COMPILE_COST_S, Regime

MS = 0.001


def test_eager_runs_until_they_have_cost_a_compile_then_compiled():
    payoff = Payoff()
    assert not payoff.compiles_now(False, False, COMPILE_COST_S)
    assert payoff.ran_eagerly(0.4) and not payoff.ran_eagerly(0.4)  # the first, then not
    assert not payoff.compiles_now(False, False, COMPILE_COST_S)
    payoff.ran_eagerly(0.1, weight=3.0)  # a training call's forward, counted with its backward
    assert payoff.spent_s == 1.1 and payoff.eager_s == 0.9
    assert payoff.compiles_now(False, False, COMPILE_COST_S)


def test_compiled_runs_slower_than_eager_ones_turn_it_eager_for_good():
    payoff = Payoff()
    for _ in range(10):
        payoff.ran_eagerly(1 * MS)
    found = [payoff.ran_compiled(2 * MS) for _ in range(COMPARED_RUNS + 3)]
    assert found == [False] * (COMPARED_RUNS - 1) + [True] + [False] * 3  # said once
    assert payoff.slower and not payoff.compiles_now(True, False, 0.0)
    assert "2.00 ms a run against 1.00 ms" in payoff.slower_reason()


def test_compiled_runs_as_fast_as_eager_ones_stay_compiled():
    payoff = Payoff()
    payoff.ran_eagerly(2 * MS)
    assert not any(payoff.ran_compiled(1 * MS) for _ in range(COMPARED_RUNS * 2))
    assert payoff.compiles_now(True, False, COMPILE_COST_S)


def test_with_nothing_run_eagerly_compiled_runs_are_never_compared():
    """``--sync-compile`` compiles at once: compiled code is what it asks for."""
    payoff = Payoff()
    assert payoff.compiles_now(False, True, COMPILE_COST_S)
    assert not any(payoff.ran_compiled(1.0) for _ in range(COMPARED_RUNS * 2))
    assert payoff.compiles_now(True, True, COMPILE_COST_S)


def train(engine: FusionEngine | None, steps: int, seen: list) -> tuple[torch.nn.Module, list[float]]:
    """SGD on a 4x4 Linear, in a fused scope whose hot calls compile after 2 ms of eager runs
    (or in strict mode: no engine), until its call runs eagerly again (or ``steps`` steps)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    options = FuseOptions(hot_training=True, compile_after_s=0.002)
    losses: list[float] = []
    with engine.scope(options, adopt=(model, optimizer)) if engine else contextlib.nullcontext():
        while len(losses) < steps and not any(
            "slower" in (getattr(g, "miss_reason", "") or "") for g in seen
        ):
            if engine and any(getattr(g, "status", None) == "compiling" for g in seen[-3:]):
                engine.cache.wait_idle()  # the worker's compile, however busy the machine is
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def test_a_tiny_model_compiled_slower_than_eager_trains_eagerly_again_with_strict_answers():
    """A 4x4 Linear's forward costs microseconds eagerly; compiled, Dynamo's guards and the
    wrapper cost far more. Its call compiles once its eager runs paid for it (a small budget
    here), proves slower, and runs eagerly from then on, saying why; the answers are strict's."""
    seen: list = []
    model, losses = train(FusionEngine(torch.device("cpu"), seen.append), 5000, seen)
    groups = [g for g in seen if isinstance(g, FusionGroup) and g.key == "Linear-training"]
    rows = [(g.status, g.miss_reason) for g in groups]
    assert ("eager", UNTIL_PAID_FOR) in rows and "hit" in {status for status, _ in rows}, rows
    assert rows[-1][0] == "eager" and rows[-1][1].startswith("compiled, it ran slower than eagerly"), rows
    assert model._compiled_call_impl.payoff[Regime.TRAINING].slower
    strict_model, strict_losses = train(None, len(losses), [])
    assert losses == pytest.approx(strict_losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(model.weight, strict_model.weight)
