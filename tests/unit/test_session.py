from __future__ import annotations

import pytest
import torch

from tpunb.debug import DebugCheckError
from tpunb.modes import Mode, ModeConfig
from tpunb.runtimes import ModeUnavailable, RuntimeChoice
from tpunb.runtimes.native import NativeRuntime
from tpunb.session import Session

DEBUG = ModeConfig(Mode.DEBUG)
STRICT = ModeConfig(Mode.STRICT)


@pytest.fixture
def session():
    s = Session(NativeRuntime(), RuntimeChoice("native", "test"))
    yield s
    s.end_cell(None)  # close whatever scope a test left open


def nan_op():
    return torch.log(torch.tensor([-1.0]))


def test_set_default_applies_at_once_in_a_script(session):
    session.set_default(DEBUG)
    assert session.effective == DEBUG
    with pytest.raises(DebugCheckError):
        nan_op()
    session.set_default(STRICT)
    assert torch.isnan(nan_op()).all()


def test_scopes_nest_and_restore_even_on_error(session):
    with session.scoped(DEBUG):
        assert session.effective.mode is Mode.DEBUG
        with session.scoped(STRICT):
            nan_op()  # strict inside debug: no check
        with pytest.raises(DebugCheckError):
            nan_op()
        with pytest.raises(ZeroDivisionError), session.scoped(STRICT):
            1 / 0  # noqa: B018
        assert session.effective.mode is Mode.DEBUG
    assert session.effective.mode is Mode.STRICT
    nan_op()


class EagerOnlyRuntime(NativeRuntime):
    """The native runtime limited to debug and strict, as a runtime without fusing would be."""

    modes = frozenset({Mode.DEBUG, Mode.STRICT})


def test_unsupported_modes_are_refused_and_change_nothing():
    session = Session(EagerOnlyRuntime(), RuntimeChoice("native", "test"))
    session.set_default(DEBUG)
    events = session.bus.count("mode")
    for mode in (Mode.FUSED, Mode.COMPILE):
        with pytest.raises(
            ModeUnavailable, match=f"{mode.value} mode is not available on the native runtime"
        ):
            session.set_default(ModeConfig(mode))
        with pytest.raises(ModeUnavailable), session.scoped(ModeConfig(mode)):
            pass
    assert session.effective == DEBUG
    assert session.bus.count("mode") == events


def test_mode_changes_are_published(session):
    session.set_default(DEBUG, source="magic")
    record = session.bus.recent("mode")[-1]
    assert (record.previous, record.current, record.source) == ("strict", "debug", "magic")


def test_cells_open_and_close_the_scope_and_record_a_run(session):
    session.begin_cell(1)
    session.end_cell(None)  # a notebook: scopes are open only inside cells
    session.set_default(DEBUG)
    nan_op()  # between cells: plain PyTorch
    session.begin_cell(7)
    with pytest.raises(DebugCheckError) as caught:
        nan_op()
    record = session.end_cell(caught.value)
    assert record.cell == 7 and record.mode == "debug" and record.error == "DebugCheckError"
    assert record.peak_bytes is None  # the CPU cannot reset its peak per cell
    assert session.bus.recent("cell")[-1] == record
    nan_op()


def test_a_default_requested_while_a_cell_runs_waits_for_the_cell_to_end(session):
    """The lab picker's path when its message is handled beside a running cell (ipykernel
    subshells): the cell keeps its mode, the next cell gets the pick."""
    session.begin_cell(1)
    assert session.request_default(DEBUG, source="lab") is False
    assert session.pending_default == DEBUG
    assert session.effective == STRICT
    nan_op()  # still strict: no check
    session.end_cell(None)
    assert session.default == DEBUG and session.pending_default is None
    assert session.bus.recent("mode")[-1].source == "lab"
    session.begin_cell(2)
    with pytest.raises(DebugCheckError):
        nan_op()
    session.end_cell(None)
    assert session.request_default(STRICT, source="lab") is True  # between cells: at once
    assert session.default == STRICT


def test_a_requested_default_the_runtime_cannot_run_is_refused_at_once():
    session = Session(EagerOnlyRuntime(), RuntimeChoice("native", "test"))
    session.begin_cell(1)
    with pytest.raises(ModeUnavailable):
        session.request_default(ModeConfig(Mode.FUSED), source="lab")
    assert session.pending_default is None
    session.end_cell(None)


def test_cell_mode_leaves_out_strict_when_a_cell_switched(session):
    session.begin_cell(1)
    with session.scoped(DEBUG):
        pass
    assert session.end_cell(None).mode == "debug"
    session.begin_cell(2)
    assert session.end_cell(None).mode == "strict"


def test_a_cell_run_whole_in_a_mode_is_named_by_that_mode_alone(session):
    """With debug the default, a ``%%tpu_mode strict`` cell opens in debug and runs its code in
    strict: its summary said ``debug``, and a compile cell's ``debug+compile``."""
    session.set_default(DEBUG)
    try:
        session.begin_cell(1)
        with session.scoped(ModeConfig(), whole_cell=True):
            pass
        assert session.end_cell(None).mode == "strict"
        session.begin_cell(2)
        with session.scoped(ModeConfig.build("fused"), whole_cell=True):
            pass
        assert session.end_cell(None).mode == "fused"
        session.begin_cell(3)
        with session.scoped(ModeConfig.build("fused")):  # a block inside the cell's code
            pass
        assert session.end_cell(None).mode == "debug+fused"
    finally:
        session.set_default(ModeConfig())


def test_stats_has_the_documented_keys(session):
    stats = session.stats()
    assert {"runtime", "device", "mode", "memory", "cache", "groups"} <= set(stats)
    assert stats["runtime"] == "native" and stats["mode"] == "strict"
    assert stats["memory"]["label"] == "host RSS" and stats["memory"]["used"] > 0
    assert set(stats["cache"]) == {"requests", "hits", "misses", "compiles"}
    assert isinstance(stats["groups"], list)


def test_script_api_fused_with_adoption():
    import tpunb

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert tpunb.adopt(model, opt) == 2
    # the recorder: with hot training the model is hot from this first step, its parameters
    # plain again at the optimizer's step (fuse/hot/hotcalls.py)
    with tpunb.mode("fused", hot_training=False):
        assert tpunb.current_mode() == "fused"
        loss = model(torch.ones(4, 3)).sum()
        loss.backward()
        opt.step()
        assert model.weight.pending is not None  # the update is recorded, not yet run
    assert model.weight.pending is None and tpunb.current_mode() == "strict"
    assert tpunb.stats()["groups"][-1]["trigger"].startswith("end of fused block")


def test_public_functions_survive_subpackage_imports():
    import tpunb
    import tpunb.monitoring.widget
    import tpunb.runtimes.native

    assert callable(tpunb.runtime) and tpunb.runtime().name == "native"
    assert callable(tpunb.monitor) and tpunb.monitor().startswith("tpunb monitor · native on cpu")


def test_the_device_tensors_belong_on_is_a_torch_device():
    import tpunb

    assert tpunb.device() == torch.device("cpu")  # the native runtime on this machine
    assert torch.ones(1, device=tpunb.device()).device.type == "cpu"
