"""The engine's mode steps aside after an outermost hot call (tpunb/fuse/aside.py): the loop's
ops on plain tensors then run as eager PyTorch, and the mode comes back for a module that is
recorded, an op on a tpunb wrapper, an optimizer step and the scope's end, never above a mode
the user entered meanwhile."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from tpunb.fuse import DeferredTensor, FuseOptions, FusionEngine
from tpunb.fuse.config import HOT_AFTER

WIDTH = 256  # wider than settled.py's small tensors, so recorded ops stay recorded


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def stack_depth() -> int:
    return torch._C._len_torch_dispatch_stack()


def engine_mode_on_top(engine: FusionEngine) -> bool:
    return getattr(_get_current_dispatch_mode(), "engine", None) is engine


class OpNames(TorchDispatchMode):
    """The user's own mode: notes the ops that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def hot_scope():
    """A fused scope in which a Linear turned hot, right after a hot call: its engine, model and input."""
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, WIDTH).eval()
    x = torch.randn(4, WIDTH)
    engine = FusionEngine(torch.device("cpu"))
    with torch.no_grad(), engine.scope(FuseOptions(compile_after_s=0), adopt=(model,)):
        for _ in range(HOT_AFTER + 1):  # the HOT_AFTER-th call turns it hot; the next runs compiled
            model(x)
        yield SimpleNamespace(engine=engine, model=model, x=x)


def test_after_a_hot_call_the_loop_runs_as_eager_pytorch(hot_scope):
    engine, model, x = hot_scope.engine, hot_scope.model, hot_scope.x
    assert not engine_mode_on_top(engine) and engine.modes.stepped_aside
    counts, hits = dict(engine.counts), engine.cache.snapshot()["hits"]
    expected = torch.nn.functional.linear(x, model.weight.detach(), model.bias.detach())
    for _ in range(3):  # hot calls while aside still run compiled, and leave the mode aside
        out = model(x)
        step = (out.argmax(-1), torch.cat([out, out]).sum())
        assert type(out) is torch.Tensor and all(type(t) is torch.Tensor for t in step)
    assert torch.allclose(out, expected, atol=1e-5)
    assert engine.counts == counts  # the loop's ops never reached the engine
    assert engine.cache.snapshot()["hits"] == hits + 3  # each call ran the compiled module


def test_a_recorded_module_call_brings_the_mode_back(hot_scope):
    engine, model, x = hot_scope.engine, hot_scope.model, hot_scope.x
    head = torch.nn.Linear(WIDTH, WIDTH)  # grad-free but never called before: recorded
    out = head(model(x))
    assert engine_mode_on_top(engine)
    assert type(out) is DeferredTensor and out.pending is not None


def test_an_op_on_a_tpunb_wrapper_goes_to_the_engine(hot_scope):
    engine = hot_scope.engine
    adopted = torch.nn.Linear(WIDTH, WIDTH)
    engine.adopt(adopted)
    assert type(adopted.weight) is DeferredTensor
    recorded = engine.counts["recorded"] + engine.counts["followed"]
    doubled = adopted.weight * 2
    assert engine_mode_on_top(engine)
    assert type(doubled) is DeferredTensor and doubled.pending is not None
    assert engine.counts["recorded"] + engine.counts["followed"] == recorded + 1
    assert torch.equal(doubled.materialized(), adopted.weight.materialized() * 2)


def test_an_optimizer_step_over_adopted_tensors_brings_the_mode_back(hot_scope):
    engine = hot_scope.engine
    weight = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))
    weight.grad = torch.ones_like(weight)
    engine.adopt(weight)
    torch.optim.SGD([weight], lr=0.1).step()
    assert engine_mode_on_top(engine)


def test_an_optimizer_step_over_plain_parameters_runs_as_eager_pytorch(hot_scope):
    """A hot training call's module has plain parameters, and autograd gave them plain
    gradients: the update runs as strict would, and the mode stays aside."""
    engine = hot_scope.engine
    weight = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))
    expected = weight.detach() - 0.1
    weight.grad = torch.ones_like(weight)
    torch.optim.SGD([weight], lr=0.1).step()
    assert engine.modes.stepped_aside and type(weight) is torch.nn.Parameter
    assert torch.equal(weight.detach(), expected)


@pytest.mark.parametrize("raises", [False, True])
def test_the_scope_leaves_the_stack_as_it_found_it(raises):
    model = torch.nn.Linear(WIDTH, WIDTH).eval()
    engine = FusionEngine(torch.device("cpu"))
    before = stack_depth()
    expect = pytest.raises(ZeroDivisionError) if raises else contextlib.nullcontext()
    with expect, torch.no_grad(), engine.scope(FuseOptions(compile_after_s=0), adopt=(model,)):
        for _ in range(HOT_AFTER + 1):
            model(torch.ones(2, WIDTH))
        assert engine.modes.stepped_aside
        if raises:
            raise ZeroDivisionError
    assert stack_depth() == before and not engine.modes.stepped_aside
    assert torch.is_grad_enabled()


def test_a_mode_the_user_entered_meanwhile_stays_on_top(hot_scope):
    engine, x = hot_scope.engine, hot_scope.x
    with OpNames() as user:
        plain = (x * 2).sum()  # plain tensors: the user's mode, then eager PyTorch
        assert not engine.modes.stepped_aside  # (the stack is not as the engine's mode left it)
        head = torch.nn.Linear(WIDTH, WIDTH)
        out = head(x)  # its pre-hook finds the user's mode on top: no resume above it
        assert _get_current_dispatch_mode() is user
    assert type(plain) is torch.Tensor and user.names[:2] == ["mul.Tensor", "sum.default"]
    # the user's mode saw head's ops first; their adopted weights then took them to the
    # engine, whose mode came back beneath the user's, where it would have been all along
    assert "addmm.default" in user.names and type(out) is DeferredTensor
    assert engine_mode_on_top(engine)
    assert torch.allclose(out.materialized(), head(x).materialized())


def test_a_nested_fused_scope_starts_from_the_outer_mode(hot_scope):
    engine = hot_scope.engine
    depth = stack_depth()
    with engine.scope(FuseOptions()):
        assert stack_depth() == depth + 2 and engine_mode_on_top(engine)
    assert stack_depth() == depth + 1 and engine_mode_on_top(engine)
