"""An interrupt (SIGINT, what a kernel's "interrupt" sends) anywhere in a fused training step
leaves the engine consistent: the next step runs and equals plain PyTorch from the same state.

The interrupt is a real signal, raised at the N-th line the engine executes, for N spread
over a whole step (recording, flushing, handing results back).
"""

from __future__ import annotations

import contextlib
import copy
import signal
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from tpunb.fuse import FuseOptions, FusionEngine, config

REPLAY = FuseOptions(compile=False)  # the bookkeeping is the same; replay keeps each trial fast
ENGINE_FILES = "/tpunb/fuse/"


@pytest.fixture(autouse=True)
def sigint_raises_keyboard_interrupt():
    """These tests raise SIGINT and expect Python's own handler (KeyboardInterrupt), as a kernel
    has it. A run started in the background (``make test &``, nohup) begins with SIGINT
    ignored, so each test installs the handler it tests, and puts back what was there."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def make_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, labels = torch.randn(16, 8), torch.randint(0, 4, (16,))

    def step(m, o) -> float:
        loss = F.cross_entropy(m(data), labels)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.item()

    return model, opt, step


def engine_lines(action, signal_at: int | None = None, raised: list[int] | None = None) -> int:
    """Run ``action`` counting the lines the engine executes; at line ``signal_at`` raise SIGINT
    (and note it in ``raised``: a step after an interrupted one may run fewer lines)."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count == signal_at:
                if raised is not None:
                    raised.append(signal_at)
                signal.raise_signal(signal.SIGINT)
        return local

    def tracer(frame, event, arg):
        return local if ENGINE_FILES in frame.f_code.co_filename.replace("\\", "/") else None

    sys.settrace(tracer)
    try:
        action()
    finally:
        sys.settrace(None)
    return count


def test_an_interrupt_anywhere_in_a_step_leaves_the_engine_consistent():
    model, opt, step = make_training()
    engine = FusionEngine(torch.device("cpu"))

    def fused_step():
        with engine.scope(REPLAY, adopt=(model, opt)):
            step(model, opt)

    for _ in range(3):  # the first steps fill the caches (and AdamW state): later ones run fewer lines
        fused_step()
    total = engine_lines(fused_step)
    assert total > 1000
    interrupted = 0
    # not the scope's last line (its own `with` exit, after the engine's work): a SIGINT this
    # test's line tracer raises there reaches Python after the traced block, and was seen lost
    # once; the engine's state is not at stake there
    samples, raised = range(1, total - 2, total // 150), []
    for signal_at in samples:
        try:
            engine_lines(fused_step, signal_at, raised)
        except KeyboardInterrupt:
            interrupted += 1
        twin = copy.deepcopy(model)
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
        twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        expected = step(twin, twin_opt)
        with engine.scope(REPLAY, adopt=(model, opt)):
            got = step(model, opt)
        assert got == pytest.approx(expected, rel=1e-5), f"SIGINT at engine line {signal_at}"
        for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(ours, theirs, msg=f"SIGINT at engine line {signal_at}")
    assert interrupted == len(raised) >= len(samples) - 2  # none was swallowed


def test_an_interrupt_in_user_code_inside_a_fused_scope_is_immediate():
    engine = FusionEngine(torch.device("cpu"))
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), engine.scope(REPLAY):
        x = torch.ones(4) * 2
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.5)  # a KeyboardInterrupt ends this at once, before the next line
        x = x + 1
    assert signal.getsignal(signal.SIGINT) is before
    assert x.tolist() == [2.0] * 4  # what was recorded before the interrupt still ran


def test_the_engine_busy_on_another_thread_does_not_hold_the_notebook_threads_interrupt():
    """Signals reach the main thread only. A tensor of the engine's used on another thread
    (a compile worker, a thread of the user's) must not hold the main thread's interrupt:
    it would be raised on that thread when it left, and the cell would never stop."""
    guard = FusionEngine(torch.device("cpu")).interrupts
    inside, leave = threading.Event(), threading.Event()

    def busy_elsewhere() -> None:
        with guard:
            inside.set()
            leave.wait(10)

    worker = threading.Thread(target=busy_elsewhere)
    worker.start()
    inside.wait(10)
    try:
        with pytest.raises(KeyboardInterrupt), guard.installed():
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.5)  # a KeyboardInterrupt ends this at once
    finally:
        leave.set()
        worker.join()


class InterruptedInFinalizer:
    """Gets SIGINT while Python finalizes it: the handler runs inside ``__del__`` (at the loop's
    backward jump), where a KeyboardInterrupt is reported as unraisable and dropped."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        for _ in range(100):
            pass


@pytest.mark.parametrize("resend_after_s", [config.RESEND_AFTER_S, 0.0])
def test_an_interrupt_a_finalizer_swallowed_still_stops_the_cell(monkeypatch, resend_after_s):
    """With no delay the interrupt is sent again as soon as the sending thread runs: were the
    hook to start that thread (and wait for it to start), it would land in the hook, dropped
    again (as it was, now and then, on a loaded machine with the 1 ms delay)."""
    monkeypatch.setattr(config, "RESEND_AFTER_S", resend_after_s)
    engine = FusionEngine(torch.device("cpu"))
    hook = sys.unraisablehook
    waited = []
    with pytest.raises(KeyboardInterrupt), engine.scope(REPLAY):
        InterruptedInFinalizer()  # dies at once
        while len(waited) < 200:  # the cell runs on: a dropped interrupt would let it finish
            waited.append(time.sleep(0.001))
    assert len(waited) < 200 and sys.unraisablehook is hook


def global_module_hooks() -> list[int]:
    """How many hooks torch's tables of global module hooks hold."""
    tables = torch.nn.modules.module
    return [
        len(tables._global_forward_pre_hooks),
        len(tables._global_forward_hooks),
        len(tables._global_forward_hooks_always_called),
    ]


def test_an_interrupt_while_a_scope_installs_or_removes_its_module_hooks_leaves_none_behind():
    """A SIGINT between registering a fused scope's global module hooks and the scope's
    cleanup left them in torch's tables for good: every later hot call traced them (a graph
    break at their thread check), ran uncompiled and was refused (found as a unit test that
    failed only after this file's sweep of interrupts)."""
    engine = FusionEngine(torch.device("cpu"))
    before = global_module_hooks()

    def install_and_remove():
        with engine.hot.hooks.installed():
            pass

    total = engine_lines(install_and_remove)
    assert total > 5
    for signal_at in range(1, total + 1):
        with contextlib.suppress(KeyboardInterrupt):
            engine_lines(install_and_remove, signal_at)
        install_and_remove()  # the next scope, uninterrupted
        assert global_module_hooks() == before, f"SIGINT at engine line {signal_at}"
