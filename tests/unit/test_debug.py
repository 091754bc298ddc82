"""Debug mode's checks, driven directly through the dispatch mode."""

from __future__ import annotations

import linecache

import pytest
import torch
import torch.nn.functional as F

from tpunb.debug import DebugCheckError, DebugChecks
from tpunb.debug_batch import nothing_deferred


@pytest.fixture(params=["each op", "gathered"])
def checks(request):
    """Debug checks read after each op (the CPU's, CUDA's) or gathered and read a few times per
    step (a TPU's, where a read costs milliseconds: debug_batch.py); both must find the same."""
    deferred = nothing_deferred if request.param == "gathered" else None

    def make(**options) -> DebugChecks:
        allow_nan, allow_inf = options.get("allow_nan", False), options.get("allow_inf", False)
        return DebugChecks(allow_nan=allow_nan, allow_inf=allow_inf, synchronize=None, deferred=deferred)

    return make


def test_nan_born_in_an_op_names_the_op_and_this_line(checks):
    x = torch.tensor([-1.0, 4.0])
    with pytest.raises(DebugCheckError) as caught, checks():
        torch.log(x)  # the line the error must name
    error = caught.value
    assert error.op == "aten.log" and "NaN" in error.problem
    assert error.where.filename == __file__
    assert error.where.code == "torch.log(x)  # the line the error must name"
    assert "input 0: float32[2] on cpu" in str(error)


def test_carried_nan_is_not_reported_again(checks):
    x = torch.tensor([float("nan"), 1.0])
    with checks():
        y = x * 2 + 1  # NaN flows through; it was not born here
    assert torch.isnan(y[0])


def test_intentional_infinities_pass_but_log_of_zero_is_caught(checks):
    scores = torch.randn(2, 3)
    mask = torch.tensor([[True, False, False], [False, False, True]])
    with checks():
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    assert torch.isfinite(probs).all()
    with pytest.raises(DebugCheckError, match=r"aten\.log produced Inf from finite inputs"), checks():
        torch.log(torch.zeros(1))


def test_in_place_ops_are_judged_on_their_inputs_before_the_write(checks):
    x = torch.tensor([-1.0])
    with pytest.raises(DebugCheckError, match=r"aten\.log_ produced NaN"), checks():
        x.log_()


def test_allow_flags(checks):
    with checks(allow_nan=True):
        torch.log(torch.tensor([-1.0]))
    with checks(allow_inf=True):
        torch.log(torch.zeros(1))
    with pytest.raises(DebugCheckError), checks(allow_inf=True):
        torch.log(torch.tensor([-1.0]))


def test_uninitialised_outputs_are_not_checked(checks):
    with checks():
        torch.empty(1000).fill_(1.0)


@pytest.mark.parametrize(
    ("name", "call", "message"),
    [
        ("embedding", lambda: F.embedding(torch.tensor([1, 5]), torch.randn(3, 2)), "index 5"),
        ("index_select", lambda: torch.randn(4, 2).index_select(0, torch.tensor([4])), "index 4"),
        ("gather", lambda: torch.randn(2, 3).gather(1, torch.tensor([[0], [-1]])), "index -1"),
        ("index", lambda: torch.randn(3, 4)[:, torch.tensor([0, 9])], "dimension 1"),
        ("index", lambda: torch.randn(3)[torch.tensor([-4])], "valid [-3, 3)"),
        ("nll_loss_forward", lambda: F.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3])), "class"),
        ("scatter_add", lambda: torch.zeros(3).scatter_add(0, torch.tensor([7]), torch.ones(1)), "7"),
    ],
)
def test_bounds_are_checked_before_the_op_runs(name, call, message, checks):
    with pytest.raises(DebugCheckError) as caught, checks():
        call()
    assert caught.value.op == f"aten.{name}"
    assert "out of bounds" in str(caught.value) and message in str(caught.value)


def test_in_bounds_indexing_and_ignored_targets_pass(checks):
    with checks():
        torch.randn(3)[torch.tensor([-3, 2])]
        F.cross_entropy(torch.randn(2, 3), torch.tensor([2, -100]))
        torch.randn(3, 4)[torch.tensor([True, False, True])]


def test_a_training_step_runs_clean_and_counts_its_ops(checks):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    mode = checks()
    with mode:
        loss = F.cross_entropy(model(torch.randn(5, 4)), torch.tensor([0, 1, 0, 1, 1]))
        loss.backward()
        opt.step()
    assert mode.ops_checked > 20
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_in_a_gradient_is_caught_in_backward(checks):
    w = torch.zeros(2, requires_grad=True)
    loss = torch.sqrt(w).sum()
    with pytest.raises(DebugCheckError, match="Inf"), checks():
        loss.backward()


def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(((a - b) ** 2).sum(-1))  # the forward line a backward error must name


def test_a_nan_born_in_backward_names_the_gradient_and_its_forward_line(checks):
    a = torch.randn(4, 3, requires_grad=True)
    b = a.detach().clone()  # distance 0: sqrt's gradient is Inf there
    with pytest.raises(DebugCheckError) as caught, checks():
        loss = distance(a, b).mean()
        loss.backward()  # where the error is raised
    error = caught.value
    node, forward = error.backward_of
    assert node == "SqrtBackward0"
    assert forward.filename == __file__ and "the forward line a backward error must name" in forward.code
    assert error.where.code == "loss.backward()  # where the error is raised"
    assert "in SqrtBackward0, the gradient of the op at" in str(error)
    assert not torch.is_anomaly_enabled()  # debug mode's anomaly recording ends with it


def test_forward_errors_have_no_backward_origin(checks):
    with pytest.raises(DebugCheckError) as caught, checks():
        torch.log(torch.tensor([-1.0]))
    assert caught.value.backward_of is None and "gradient" not in str(caught.value)


def test_gathered_checks_stop_before_a_read_at_the_line_a_nan_was_born_on():
    """Where each check's read costs milliseconds (a TPU), checks are gathered and read before
    the host reads a value: the error names the op and line of birth, not the read's."""
    x = torch.tensor([-1.0, 4.0])
    gathered = DebugChecks(allow_nan=False, allow_inf=False, synchronize=None, deferred=nothing_deferred)
    with pytest.raises(DebugCheckError) as caught, gathered:
        y = torch.log(x)  # born here
        z = y * 2  # carried on
        z.sum().item()  # raised here, before the value is handed out
    assert caught.value.op == "aten.log" and caught.value.where.code == "y = torch.log(x)  # born here"
    read = caught.value.__traceback__  # this test's frame: the line the error was raised on
    assert linecache.getline(__file__, read.tb_lineno).strip().startswith("z.sum().item()")


def test_an_attention_kernel_is_checked_on_its_result_only():
    """Attention kernels return bookkeeping beside their result that is left unset when nothing
    needs it (the log-sum-exp without a backward): a NaN there was reported on a TPU."""
    from tpunb.debug import checked_outputs

    result, bookkeeping = torch.ones(2), torch.full((2,), float("nan"))
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert checked_outputs(attention, (result, bookkeeping)) is result
    pair = (result, bookkeeping)
    assert checked_outputs(torch.ops.aten.var_mean.correction, pair) is pair  # other ops: all of it
