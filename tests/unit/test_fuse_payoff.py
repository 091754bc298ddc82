"""A hot call's or step's compile: run eagerly until it pays off, and eagerly again for good if
its compiled runs prove slower than its eager ones (fuse/hot/payoff.py, plan.py's rules)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from tpunb.events import FusionGroup
from tpunb.fuse import FuseOptions, FusionEngine
from tpunb.fuse.config import COMPARED_RUNS, COMPILE_COST_S, MAX_PROBES, MIN_QUIET_RUNS, MIN_SAVING
from tpunb.fuse.groups.cache import Variant
from tpunb.fuse.groups.plan import Regime
from tpunb.fuse.groups.worker import CompileWorker
from tpunb.fuse.hot.hotcode import architecture, lineage
from tpunb.fuse.hot.payoff import Payoff
from tpunb.fuse.hot.whole_runs import UNTIL_PAID_FOR, count_eager_run, publish_compiled_run

MS = 0.001


def test_eager_runs_until_they_have_cost_a_compile_then_compiled():
    payoff = Payoff()
    assert not payoff.compiles_now(False, False, COMPILE_COST_S)
    assert payoff.ran_eagerly(0.4) and not payoff.ran_eagerly(0.4)  # the first, then not
    assert not payoff.compiles_now(False, False, COMPILE_COST_S)
    payoff.ran_eagerly(0.1, weight=3.0)  # a training call's forward, counted with its backward
    assert payoff.spent_s == 1.1 and list(payoff.recent_eager_s) == [0.4, 0.4, 0.1]
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
    for _ in range(MIN_QUIET_RUNS):
        payoff.ran_eagerly(2 * MS)
    assert not any(payoff.ran_compiled(1 * MS) for _ in range(COMPARED_RUNS * 2))
    assert payoff.judged and payoff.compiles_now(True, False, COMPILE_COST_S)


def test_runs_timed_beside_a_compile_are_not_compared():
    """ignite's optimizer step: its eager runs, all timed beside its model's compile (4-20 ms
    against 0.2 ms alone), made its compiled step (0.2-0.4 ms) look faster. Runs timed beside a
    compile count toward the compile but are not compared; with too few quiet eager runs once
    the compiled runs are timed, it runs eagerly to time some, then judges."""
    payoff = Payoff()
    for _ in range(20):
        payoff.ran_eagerly(10 * MS, quiet=False)
    assert payoff.spent_s == pytest.approx(0.2) and not payoff.recent_eager_s
    payoff.ran_compiled(50 * MS, quiet=False)  # beside a compile: not timed
    assert not any(payoff.ran_compiled(0.3 * MS) for _ in range(COMPARED_RUNS))
    assert payoff.awaiting_eager and not payoff.compiles_now(True, False, COMPILE_COST_S)
    for _ in range(MIN_QUIET_RUNS - 1):
        payoff.ran_eagerly(0.2 * MS)
        payoff.ran_eagerly(10 * MS, quiet=False)
    assert payoff.awaiting_eager  # 3 quiet runs: one more
    payoff.ran_eagerly(0.2 * MS)
    assert payoff.judged and payoff.slower and not payoff.compiles_now(True, False, COMPILE_COST_S)
    assert "0.30 ms a run against 0.20 ms" in payoff.slower_reason()


def test_with_no_quiet_eager_run_it_is_judged_after_max_probes_and_stays_compiled():
    """A worker that keeps compiling leaves no quiet eager run: after ``MAX_PROBES`` eager runs
    it stays compiled, as it would have without the comparison."""
    payoff = Payoff()
    payoff.ran_eagerly(1 * MS, quiet=False)
    for _ in range(COMPARED_RUNS):
        payoff.ran_compiled(2 * MS)
    for _ in range(MAX_PROBES - 1):
        payoff.ran_eagerly(1 * MS, quiet=False)
    assert payoff.awaiting_eager
    payoff.ran_eagerly(1 * MS, quiet=False)
    assert payoff.judged and not payoff.slower and payoff.compiles_now(True, False, COMPILE_COST_S)


def test_runs_timed_while_the_engines_worker_compiles_are_counted_not_compared():
    """``count_eager_run`` and ``publish_compiled_run`` ask the engine's real worker (a job held
    on it); an eager run that completes the comparison publishes the verdict's row, once."""
    seen: list = []
    engine = FusionEngine(torch.device("cpu"), seen.append)
    payoff, row = Payoff(), {"key": "Net-training", "trigger": "Net call, compiled whole", "compiled": 0}
    row |= {"uncompiled": False, "compiling": False, "may_compile": True, "compiled_call": None}

    def eager_run() -> bool:
        started = time.perf_counter()
        return count_eager_run(engine, payoff, "Net-training", "Net call", started, started)

    running, release = threading.Event(), threading.Event()

    def held() -> tuple:
        running.set()
        release.wait(10)
        return (lambda *args: [], None)

    engine.cache.compile("held", Variant(lifted={}), held, wait=False)
    assert running.wait(10)
    assert not eager_run() and payoff.eager_runs == 1 and not payoff.recent_eager_s
    publish_compiled_run(engine, payoff, "Net call", 1 * MS, started=time.perf_counter(), **row)
    assert not payoff.compiled_s  # beside the compile: not timed
    release.set()
    engine.cache.wait_idle()
    for _ in range(COMPARED_RUNS):
        publish_compiled_run(engine, payoff, "Net call", 1.0, started=time.perf_counter(), **row)
    assert payoff.awaiting_eager  # no quiet eager run yet
    assert [eager_run() for _ in range(MIN_QUIET_RUNS)] == [False] * (MIN_QUIET_RUNS - 1) + [True]
    verdicts = [g for g in seen if isinstance(g, FusionGroup) and (g.plan or "").startswith("compiled, it")]
    assert len(verdicts) == 1 and payoff.slower and not eager_run()


def test_the_worker_is_quiet_since_a_time_only_if_it_compiled_nothing_after_it():
    """``CompileWorker.quiet_since`` on the real worker thread: busy, then done."""
    worker = CompileWorker()
    before = time.perf_counter()
    assert worker.quiet_since(before)
    started, release = threading.Event(), threading.Event()
    job = worker.submit(lambda: (started.set(), release.wait(10)), wait=False)
    assert started.wait(10)
    assert not worker.quiet_since(before) and not worker.quiet_since(time.perf_counter())
    release.set()
    job.result(10)
    after = time.perf_counter()
    assert not worker.quiet_since(before) and worker.quiet_since(after)


def test_with_nothing_run_eagerly_compiled_runs_are_never_compared():
    """``--sync-compile`` compiles at once: compiled code is what it asks for."""
    payoff = Payoff()
    assert payoff.compiles_now(False, True, COMPILE_COST_S)
    assert not any(payoff.ran_compiled(1.0) for _ in range(COMPARED_RUNS * 2))
    assert payoff.compiles_now(True, True, COMPILE_COST_S)


def linear_hit(event: object) -> bool:
    """A hit of the Linear's hot training call (a group row)."""
    return getattr(event, "key", None) == "Linear-training" and getattr(event, "status", None) == "hit"


def judged(model: torch.nn.Module) -> bool:
    """Whether the model's hot training call has compared its compiled and eager runs."""
    call = model._compiled_call_impl
    return call is not None and call.payoff[Regime.TRAINING].judged


def train(engine: FusionEngine | None, steps: int, seen: list) -> tuple[torch.nn.Module, list[float]]:
    """SGD on a 4x4 Linear, in a fused scope whose hot calls compile after 50 ms of eager runs,
    until its call's compiled and eager runs have been compared (hits timed beside a compile
    are not: the compiler may be busy with the step's or an earlier test's compile for a while)
    and it has hit twice more, or ``steps`` steps; in strict mode (no engine), ``steps``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    options = FuseOptions(hot_training=True, compile_after_s=0.05)
    losses: list[float] = []
    with engine.scope(options, adopt=(model, optimizer)) if engine else contextlib.nullcontext():
        while len(losses) < steps and not (judged(model) and sum(map(linear_hit, seen)) >= COMPARED_RUNS + 2):
            if engine and any(getattr(g, "status", None) == "compiling" for g in seen[-3:]):
                engine.cache.wait_idle()  # the worker's compile, however busy the machine is
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def test_a_hot_call_runs_eagerly_then_compiled_then_as_its_timings_say_with_strict_answers():
    """The whole sequence on a real model: eager runs until they paid for the compile (one row
    says so), then compiled (captured, then hits), then, from its first ``COMPARED_RUNS`` hits,
    compiled or eager as they compare (the rule itself: the tests above); the answers are
    strict's throughout."""
    seen: list = []
    model, losses = train(FusionEngine(torch.device("cpu"), seen.append), 50_000, seen)
    groups = [g for g in seen if isinstance(g, FusionGroup) and g.key == "Linear-training"]
    statuses = [g.status for g in groups]
    first = groups[0]
    assert (first.status, first.plan, first.miss_reason) == ("op by op", UNTIL_PAID_FOR, None), first
    assert "hit" in statuses, statuses
    payoff = model._compiled_call_impl.payoff[Regime.TRAINING]
    assert payoff.spent_s >= 0.05 and len(payoff.compiled_s) == COMPARED_RUNS
    slower = [g for g in groups if (g.plan or "").startswith("compiled, it ran slower than eagerly")]
    assert len(slower) == payoff.slower  # said once, where the timings said so
    # a Linear built again runs eagerly first too if compiled proved slower (hotcode.py)
    assert model._compiled_call_impl.code(Regime.TRAINING).slower == payoff.slower
    if payoff.slower:  # no compiled run after it
        assert statuses[statuses.index("op by op", statuses.index("hit")) :] == ["op by op"], statuses
    strict_model, strict_losses = train(None, len(losses), [])
    assert losses == pytest.approx(strict_losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(model.weight, strict_model.weight)


def test_a_model_defined_again_counts_only_what_compiling_saved_its_earlier_definition():
    """Rent or buy with the measured saving: each eager run of a model defined again counts the
    share of a call that compiling saved its earlier definition (a word-level LSTM run again
    with ``%run`` saved 4 % and paid a fresh capture each run)."""
    earlier = Payoff()
    for _ in range(4):
        earlier.ran_eagerly(20 * MS)
    assert earlier.measured_saving() is None  # before two compiled runs
    earlier.ran_compiled(19 * MS)
    assert earlier.measured_saving() is None
    earlier.ran_compiled(19 * MS)
    assert earlier.measured_saving() == pytest.approx(0.05)
    again = Payoff(saving=earlier.measured_saving())
    again.ran_eagerly(0.4)
    assert again.spent_s == pytest.approx(0.02) and not again.compiles_now(False, False, COMPILE_COST_S)
    slower = Payoff()
    for seconds in (MS, MS, 2 * MS, 2 * MS):
        (slower.ran_eagerly if seconds == MS else slower.ran_compiled)(seconds)
    assert slower.measured_saving() == MIN_SAVING  # a long loop still compiles, 50 times later


NET = """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.layer(x).tanh(){edit}
"""


def defined(edit: str = "") -> type:
    """``Net`` defined anew from its source, as a script run again with ``%run`` defines it."""
    namespace: dict = {"torch": torch}
    exec(compile(NET.format(edit=edit), "net_script.py", "exec"), namespace)
    return namespace["Net"]


def test_a_class_defined_again_from_the_same_code_has_its_earlier_definitions_lineage():
    first, again, edited = defined()(), defined()(), defined(" * 2")()
    assert type(first) is not type(again)
    assert architecture(first) != architecture(again)  # Dynamo's guards see another class
    assert lineage(first, architecture(first)) == lineage(again, architecture(again))
    assert lineage(first, architecture(first)) != lineage(edited, architecture(edited))


def test_a_hot_call_of_a_model_defined_again_starts_from_what_compiling_saved_the_earlier_one():
    engine = FusionEngine(torch.device("cpu"))
    options = FuseOptions(hot_training=True, compile_after_s=2e-4)  # a few eager runs first
    models, stored = [], []
    for _ in range(2):
        torch.manual_seed(0)
        model = defined()()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with engine.scope(options, adopt=(model, optimizer)):
            for step in range(40):
                if step >= 20:  # compiled from here: its calls hit, timed with the worker quiet
                    engine.cache.wait_idle()  # (the step's compile is queued meanwhile)
                optimizer.zero_grad()
                model(torch.ones(8, 4)).sum().backward()
                optimizer.step()
        models.append(model)
        stored.append(engine.hot.codes.saving(model._compiled_call_impl.kin, Regime.TRAINING))
    first, again = (model._compiled_call_impl.payoff[Regime.TRAINING] for model in models)
    assert len(first.compiled_s) >= 2 and MIN_SAVING <= stored[0] <= 1.0
    assert first.saving == 1.0 and again.saving == stored[0]  # what the first measured, as it ended


def test_the_notebooks_wait_while_dynamo_captured_is_counted_unless_asked_for():
    """A hot call's capture holds the notebook's thread (the summary says so, report.py): its
    seconds beyond an eager run are counted once, under the call's name, and later hits add
    nothing; with ``--sync-compile`` the cell asked for the wait, and nothing is counted."""
    seen: list = []
    engine = FusionEngine(torch.device("cpu"), seen.append)
    started = time.perf_counter()
    train(engine, 50_000, seen)
    spent = time.perf_counter() - started
    waited = engine.capture_s["Linear call"]
    assert 0 < waited < spent and set(engine.capture_s) <= {"Linear call", "SGD.step()"}
    # and the steps' time over those before the capture, the capture's step among them
    assert 0 < engine.step_clock.compile_cost_s < spent
    train(engine, 20, seen)  # the same model class again: its code is Dynamo's already
    assert engine.capture_s["Linear call"] == waited
    asked = FusionEngine(torch.device("cpu"))
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(8, 4)
    with asked.scope(FuseOptions(hot_training=True, sync_compile=True), adopt=(model,)):
        for _ in range(6):
            model(x).sum().backward()
    assert model._compiled_call_impl.called and not asked.capture_s
