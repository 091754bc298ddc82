"""Fused mode's semantics on the native engine: results, flush points, aliasing, errors.

Groups replay op by op here (``compile=False``) so each test checks recording and
materialization, not Inductor; test_fuse_training.py covers compiled groups.
"""

from __future__ import annotations

import io
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F

from tpunb.events import EventBus
from tpunb.fuse import DeferredTensor, FusedOpError, FuseOptions, FusionEngine
from tpunb.fuse.config import SMALL_NUMEL

REPLAY = FuseOptions(compile=False)


@pytest.fixture
def bus():
    return EventBus()


@pytest.fixture
def engine(bus):
    return FusionEngine(torch.device("cpu"), bus.publish)


def groups(bus):
    return bus.recent("group")


def chain(x: torch.Tensor, n: int = 50) -> torch.Tensor:
    y = x
    for _ in range(n):
        y = y + 1
        y = y * 2
        y = y - 1
    return y


def test_a_chain_is_one_group_and_equals_eager(engine, bus):
    x = torch.randn(64, 64)
    with engine.scope(REPLAY):
        y = chain(x)
        assert isinstance(y, DeferredTensor) and y.pending is not None
        assert y.shape == (64, 64) and y.dtype == torch.float32
    assert y.pending is None
    torch.testing.assert_close(y.materialized(), chain(x))
    (group,) = groups(bus)
    assert group.ops == 150 and group.trigger.startswith("end of fused block")


def test_each_group_is_named_by_what_needed_its_values_as_the_user_wrote_it(engine, bus):
    a = torch.randn(1_000_000)  # too big to settle: every flush below is a group of its own
    with engine.scope(REPLAY):
        total = (a * 2 + 1).relu().sum().item()
        c = a / total
        repr(c[:3])
        if c.mean() > 0:
            c = c - 1
        torch.allclose(c, a)
        d = c * 2  # noqa: F841 - runs at the end of the block
    said = [group.trigger.split(" at ")[0] for group in groups(bus)]
    assert said == [".item()", "print / repr", "if tensor / bool()", "torch.allclose", "end of fused block"]


def test_factories_inside_the_scope_are_deferred(engine):
    torch.manual_seed(3)
    expected = torch.randn(5) + torch.zeros(5)
    torch.manual_seed(3)
    with engine.scope(REPLAY):
        value = torch.randn(5) + torch.zeros(5)
        assert value.pending is not None
    torch.testing.assert_close(value.materialized(), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("item", lambda t: t.sum().item()),
        ("bool", lambda t: bool(t.sum() > 0)),
        ("tolist", lambda t: t.tolist()),
        ("numpy", lambda t: t.numpy()),
        ("repr", repr),
        ("format", lambda t: f"{t}"),
        ("cpu", lambda t: t.cpu()),
        ("data_ptr", lambda t: t.data_ptr()),
        ("pickle", pickle.dumps),
        ("torch.save", lambda t: torch.save(t, io.BytesIO())),
        ("nonzero", lambda t: torch.nonzero(t > 0)),
        ("mask", lambda t: t[t > 0]),
    ],
)
def test_flush_points(engine, bus, name, read):
    x = torch.randn(10)
    with engine.scope(REPLAY):
        y = x * 3
        read(y)
        assert y.pending is None, f"{name} did not flush"
        assert len(groups(bus)) == 1
    torch.testing.assert_close(y.materialized(), x * 3)


def test_data_dependent_results_are_right(engine):
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    with engine.scope(REPLAY):
        y = x * 2
        positives = y[y > 0]
        count = int((y > 0).sum())
        z = positives + 1
    assert count == 2
    assert z.tolist() == [5.0, 9.0]


def test_pickled_and_saved_values_load_as_plain_tensors(engine):
    with engine.scope(REPLAY):
        y = torch.arange(4.0) * 2
    buffer = io.BytesIO()
    torch.save({"y": y}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["y"]
    assert type(loaded) is torch.Tensor and loaded.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert type(pickle.loads(pickle.dumps(y))) is torch.Tensor


def test_max_ops_bounds_a_loop_without_syncs(engine, bus):
    x = torch.randn(8)
    with engine.scope(FuseOptions(compile=False, max_ops=100)):
        y = chain(x, 100)  # 300 ops
    assert [g.ops for g in groups(bus)] == [100, 100, 100]
    assert groups(bus)[0].trigger.startswith("max_ops=100")
    torch.testing.assert_close(y.materialized(), chain(x, 100))


# --- aliasing, views and in-place ------------------------------------------------------------


def test_in_place_on_a_pending_base_is_seen_through_a_pending_view(engine):
    zeros = torch.zeros(3, 4)  # a small factory in the scope would run at once (settled.py)
    with engine.scope(REPLAY):
        base = zeros.clone()
        row = base[1]
        base.add_(1)
        row.mul_(5)
    assert base.materialized().tolist() == [[1.0] * 4, [5.0] * 4, [1.0] * 4]
    assert row.materialized().tolist() == [5.0] * 4
    assert row.materialized().untyped_storage().data_ptr() == base.materialized().untyped_storage().data_ptr()


def test_in_place_through_a_view_writes_the_materialized_base(engine):
    with engine.scope(REPLAY):
        base = torch.zeros(2, 3) + 1
    with engine.scope(REPLAY):
        base[0].add_(10)
        column = base[:, 2]
        column.mul_(2)
        assert base.tolist() == [[11.0, 11.0, 22.0], [1.0, 1.0, 2.0]]


def test_writes_into_tensors_from_outside_flush_and_run_eagerly(engine, bus):
    real = torch.zeros(4)
    with engine.scope(REPLAY):
        y = real + 1  # reads `real`...
        real.add_(5)  # ...then writes it: the read must see the old value
        z = real * 2
    assert y.materialized().tolist() == [1.0] * 4
    assert real.tolist() == [5.0] * 4 and type(real) is torch.Tensor
    assert z.materialized().tolist() == [10.0] * 4
    assert any(g.trigger.startswith("Tensor.add_") for g in groups(bus))


def test_scalar_bookkeeping_does_not_cut_the_group(engine, bus):
    step = torch.tensor(0.0)
    x = torch.randn(6)
    with engine.scope(REPLAY):
        y = x * 2
        step += 1
        value = step.item()
        y = y + value
    assert len(groups(bus)) == 1 and value == 1.0
    torch.testing.assert_close(y.materialized(), x * 2 + 1)


def test_a_counter_the_group_reads_can_advance_without_cutting_it(engine, bus):
    """HF's static KV cache: each layer reads its 0-d position counter, then advances it."""
    counter = torch.tensor(3)
    cache = torch.zeros(8)
    with engine.scope(REPLAY):
        positions = torch.arange(2) + counter  # reads the counter...
        counter.add_(2)  # ...which then advances: the group must still see 3
        cache = cache.index_copy(0, positions, torch.ones(2))
        later = torch.arange(2) + counter  # a read after the write sees 5
    assert len(groups(bus)) == 1
    assert positions.materialized().tolist() == [3, 4] and later.materialized().tolist() == [5, 6]
    assert cache.materialized().tolist() == [0, 0, 0, 1, 1, 0, 0, 0] and counter.item() == 5


@pytest.mark.parametrize(
    "case",
    ["large", "view", "storage read twice"],
)
def test_a_write_that_a_copy_would_not_cover_still_cuts_the_group(engine, bus, case):
    real = torch.zeros(100) if case == "large" else torch.zeros(4)
    with engine.scope(REPLAY):
        read = real[1:3] + 1 if case == "view" else real + 1
        also = real.view(2, 2) * 3 if case == "storage read twice" else read  # the same storage, twice
        real.add_(5)
    assert read.materialized()[0].item() == 1.0 and also.materialized().flatten()[0].item() in (0.0, 1.0)
    assert any(g.trigger.startswith("Tensor.add_") for g in groups(bus))


def test_a_captured_tensor_changed_behind_tpunbs_back_is_an_error(engine):
    real = torch.zeros(3)
    with pytest.raises(FusedOpError, match="changed outside tpunb's view"), engine.scope(REPLAY):
        y = real + 1
        writer = threading.Thread(target=real.add_, args=(7,))  # other threads are not recorded
        writer.start()
        writer.join()
        del y
    assert engine.trace.ops == []


# --- adoption: parameters and optimizer state ---------------------------------------------------


def test_adopted_parameters_keep_identity_and_work_outside_fused_mode(engine):
    model = torch.nn.Linear(4, 2)
    weight = model.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert engine.adopt(model, opt) == 2
    assert model.weight is weight and isinstance(weight, torch.nn.Parameter)
    assert isinstance(weight, DeferredTensor) and weight.requires_grad and weight.is_leaf
    assert repr(weight).startswith("Parameter containing:")
    # strict (no scope): plain eager, plain results, gradients accumulate
    out = model(torch.randn(3, 4)).sum()
    assert type(out) is torch.Tensor
    out.backward()
    assert weight.grad is not None and weight.grad.shape == (2, 4)
    before = weight.detach().clone()
    opt.step()
    assert not torch.equal(before, weight.detach())
    state = model.state_dict()
    assert type(state["weight"]) is torch.Tensor


def test_rng_streams_match_eager_for_the_same_seed(engine):
    x = torch.ones(1000)
    torch.manual_seed(7)
    expected = F.dropout(x, 0.5) * torch.rand(1000)
    torch.manual_seed(7)
    with engine.scope(REPLAY):
        got = F.dropout(x, 0.5) * torch.rand(1000)
    torch.testing.assert_close(got.materialized(), expected, rtol=0, atol=0)


# --- errors ---------------------------------------------------------------------------------------


def test_shape_errors_raise_at_the_recording_line(engine):
    with pytest.raises(RuntimeError, match="size of tensor a") as caught, engine.scope(REPLAY):
        torch.randn(3) + torch.randn(4)  # the failing line
    frames = [f for f in caught.traceback if str(f.path) == __file__]
    assert "the failing line" in str(frames[-1].statement)


def test_errors_found_at_flush_name_the_op_and_its_line(engine):
    table = torch.randn(3, 2)
    with pytest.raises(FusedOpError) as caught, engine.scope(REPLAY):
        index = torch.tensor([0, 7]) + 0
        picked = table.index_select(0, index)  # recorded here, fails when the group runs
        del picked
    message = str(caught.value)
    assert "aten.index_select failed" in message
    assert "picked = table.index_select(0, index)" in message
    with engine.scope(REPLAY):  # the engine is usable afterwards
        assert (table * 1).tolist() == table.tolist()


def test_a_failed_groups_tensors_say_so(engine):
    table = torch.randn(3, 2)
    with engine.scope(REPLAY):
        kept = table * 2
        try:
            bad = table.index_select(0, torch.tensor([9]) + 0)
            bad.tolist()
        except FusedOpError:
            pass
    with pytest.raises(FusedOpError, match="value was lost when its group failed"):
        kept.tolist()


def test_interrupting_a_fused_loop_leaves_finished_steps_and_a_working_engine(engine):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 3)
    twin = torch.nn.Linear(3, 1)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt), engine.scope(REPLAY, adopt=(model, opt)):
        for step in range(10):
            loss = model(data).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 3:
                raise KeyboardInterrupt
    for _ in range(4):
        loss = twin(data).pow(2).mean()
        twin_opt.zero_grad()
        loss.backward()
        twin_opt.step()
    torch.testing.assert_close(model.weight.detach(), twin.weight.detach())
    assert engine.trace.ops == []
    with engine.scope(REPLAY):
        assert (model.weight * 0).sum().item() == 0.0


def test_conjugate_views_keep_their_values(engine):
    """ifft and .conj() return conjugate views (a bit, not new data). A wrapper cannot carry
    the bit, so they run eagerly and stay plain; recorded, later ops read the raw values
    wherever PyTorch's conjugate fallback does not run (a flush from inside dispatch, the
    eager path, ops on the result after the scope). ``x`` is big enough that ops on the
    eagerly made values still record (small ones would run at once: settled.py)."""
    x = torch.randn(4, SMALL_NUMEL // 4 + 6)
    c = torch.randn(3, 4, dtype=torch.complex64)
    with engine.scope(REPLAY):
        y = torch.fft.ifft(x.clone())
        z = y * 2
        assert torch.ones(1).nonzero().numel() == 1  # runs eagerly: flushes from inside dispatch
        d = c.clone().conj()
        picked = torch.masked_select(d, torch.ones(d.shape, dtype=torch.bool))  # eager
    torch.testing.assert_close(z.materialized(), torch.fft.ifft(x) * 2)
    torch.testing.assert_close(picked, c.conj().flatten())
    torch.testing.assert_close(y + 0, torch.fft.ifft(x))
    assert y.is_conj() and d.is_conj()


def test_a_plain_negative_view_is_not_fed_to_compiled_code(engine):
    x = torch.randn(3, 3, dtype=torch.complex64)
    same_layout = torch.randn(3, 3, dtype=torch.complex64).imag
    negative = x.conj().imag  # a float32 view with the negative bit: compiled code would drop it
    for a in (same_layout, same_layout, negative):
        with engine.scope(FuseOptions(sync_compile=True)):
            y = a.clone() * 2
        torch.testing.assert_close(y.materialized() if isinstance(y, DeferredTensor) else y, a * 2)


def test_the_real_part_of_a_pending_complex_result_is_the_tensor_attribute(engine):
    """FNet reads ``torch.fft.fftn(x).real``: the attribute must be the real part, recorded like
    any view, not a method of the wrapper."""
    x = torch.randn(4, 8)
    with engine.scope(FuseOptions(compile=False)):
        part = torch.fft.fftn(x).real + 1.0
    torch.testing.assert_close(part.materialized(), torch.fft.fftn(x).real + 1.0)


@pytest.mark.parametrize("layout", ["slice", "transpose"])
def test_a_small_strided_plain_input_gives_strict_results_and_metadata(engine, layout):
    history = torch.arange(24.0).reshape(2, 12)
    small = history[:, -1:] if layout == "slice" else torch.arange(6.0).reshape(2, 3).t()
    with engine.scope(REPLAY):
        out = small * 2 + 1
    expected = small * 2 + 1
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out.materialized(), expected)
    assert out.materialized().stride() == expected.stride()


@pytest.mark.parametrize("options", [REPLAY, FuseOptions(sync_compile=True)], ids=["replayed", "compiled"])
def test_a_flush_from_python_under_autocast_runs_the_dtypes_autocast_chose(engine, options):
    """Autocast casts before the engine records, so a group must not be cast again when it runs:
    a flush from Python code (an optimizer hook, a module turning hot) runs inside the user's
    autocast (a PEFT BERT step in bf16 failed in softmax's backward: fp32 grad, bf16 output)."""
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
        expected_full = (x @ w).sum()
        with torch.autocast("cpu", enabled=False):
            expected = torch.tanh(x @ w) * 3
        for _ in range(2):  # the second sighting compiles
            with engine.scope(options):
                with torch.autocast("cpu", enabled=False):
                    got = torch.tanh(x @ w) * 3  # fp32 matmul inside a bf16 cell
                got_full = (x @ w).sum()
                engine.flush("a hook")
            assert got.dtype == torch.float32 and got_full.dtype == torch.bfloat16
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(got_full, expected_full)
