"""``tpunb.jax_op`` with real JAX on the CPU: values, gradients, Pallas, modes, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import tpunb
from tpunb.debug import DebugCheckError
from tpunb.jaxops import JaxOpError, bridge
from tpunb.session import get_session

jax = pytest.importorskip("jax", reason="tpunb[jax] is part of the dev install")
jnp = jax.numpy


@tpunb.jax_op
def gelu_scale(x, scale=2.0):
    """A fused GELU-and-scale: one XLA kernel in JAX."""
    return jax.nn.gelu(x, approximate=True) * scale


def gelu_scale_reference(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh") * scale


def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@tpunb.jax_op
def pallas_add(x, y):
    return tpunb.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def test_a_jnp_function_matches_torch_forward_and_gradient():
    x = torch.randn(16, 32, requires_grad=True)
    out = gelu_scale(x, scale=3.0)
    expected = gelu_scale_reference(x, 3.0)
    torch.testing.assert_close(out, expected)
    weights = torch.randn(16, 32)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(grad, expected_grad)


def test_several_inputs_and_outputs_and_integer_inputs_without_gradients():
    @tpunb.jax_op
    def pick_and_norm(table, ids):
        rows = table[ids]
        return rows, jnp.linalg.norm(rows, axis=-1)

    table = torch.randn(10, 4, requires_grad=True)
    ids = torch.tensor([1, 3, 3, 7], dtype=torch.int32)
    rows, norms = pick_and_norm(table, ids)
    torch.testing.assert_close(rows, table[ids.long()])
    torch.testing.assert_close(norms, table[ids.long()].norm(dim=-1))
    norms.sum().backward()  # only one output used: the other's cotangent is zero
    expected = torch.zeros(10, 4)
    picked = table.detach()[ids.long()]
    expected.index_add_(0, ids.long(), picked / picked.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(table.grad, expected)


def test_a_pallas_kernel_runs_interpreted_on_the_cpu_and_matches_torch():
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(pallas_add(x, y), x + y)


def test_a_model_with_a_jax_op_trains_like_its_torch_twin():
    torch.manual_seed(0)
    data, labels = torch.randn(64, 16), torch.randint(0, 4, (64,))

    def make():
        torch.manual_seed(1)
        return torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def train(activation) -> list[float]:
        first, second = make()
        params = [*first.parameters(), *second.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-2)
        losses = []
        for _ in range(20):
            loss = torch.nn.functional.cross_entropy(second(activation(first(data))), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    with_jax = train(gelu_scale)
    with_torch = train(gelu_scale_reference)
    assert with_jax[-1] < 0.6 * with_jax[0]
    assert with_jax == pytest.approx(with_torch, rel=1e-4)


def test_tensors_cross_to_jax_and_back_without_copies(monkeypatch):
    """On the CPU both directions share memory. The check: the JAX array made from a tensor
    points at the tensor's memory, and the op's output points at the buffer JAX computed
    into (recorded by wrapping the bridge's own function, which still does the work)."""
    x = torch.randn(32, 32)
    assert bridge.to_jax(x).unsafe_buffer_pointer() == x.data_ptr()
    buffers: list[int] = []
    real_to_torch = bridge.to_torch

    def recording(array, device):
        buffers.append(array.unsafe_buffer_pointer())
        return real_to_torch(array, device)

    monkeypatch.setattr("tpunb.jaxops.op.to_torch", recording)
    out = gelu_scale(x)
    assert buffers == [out.data_ptr()]


def test_debug_mode_checks_a_jax_ops_outputs_and_names_it():
    @tpunb.jax_op
    def log_of(x):
        return jnp.log(x)

    with tpunb.mode("debug"), pytest.raises(DebugCheckError) as caught:
        log_of(torch.tensor([1.0, -1.0]))
    message = str(caught.value)
    assert message.startswith("tpunb_jax.log_of produced NaN from inputs without NaN")
    assert "test_jax_op.py" in message


def test_in_fused_mode_a_jax_op_is_its_own_group_with_jax_compile_events():
    @tpunb.jax_op
    def scaled_tanh(x):
        return jnp.tanh(x) * 1.5

    bus = get_session().bus
    x = torch.randn(8, 8)
    expected = [(torch.tanh(x * 2 + 1) * 1.5).sum() for _ in range(2)]
    got = []
    with tpunb.mode("fused"):
        for _ in range(2):
            got.append(scaled_tanh(x * 2 + 1).sum().item())
    assert got == pytest.approx([e.item() for e in expected], rel=1e-5)
    jax_groups = [g for g in bus.recent("group") if g.key.startswith("jax:scaled_tanh")]
    assert [g.status for g in jax_groups] == ["miss", "hit"]
    assert jax_groups[0].compile_ms > 0 and jax_groups[1].compile_ms is None
    assert jax_groups[0].top_ops == {"jax:scaled_tanh": 1} and jax_groups[0].input_shapes == [[8, 8]]
    # the pending `x * 2 + 1` was flushed by the JAX op, which named itself as the trigger
    flushed_by_it = [g for g in bus.recent("group") if g.trigger.startswith("tpunb_jax.scaled_tanh")]
    assert len(flushed_by_it) == 2


def test_torch_compile_traces_a_jax_op_with_its_shapes_and_gradient():
    compiled = torch.compile(lambda x: gelu_scale(x * 2).sum(), backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 8, requires_grad=True)
    loss = compiled(x)
    loss.backward()
    expected_x = x.detach().clone().requires_grad_()
    gelu_scale_reference(expected_x * 2).sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad)


def test_wrong_output_hints_name_the_op_the_output_and_the_line():
    @tpunb.jax_op(out=((4, 16), torch.float32))
    def widen(x):
        return jnp.concatenate([x, x], axis=0)

    with pytest.raises(JaxOpError) as caught:
        widen(torch.randn(4, 8))
    message = str(caught.value)
    assert message.startswith("jax op widen: output 0 is float32[8, 8], but out= says float32[4, 16]")
    assert "test_jax_op.py" in message

    @tpunb.jax_op(out=lambda x: ((x.shape[0] * 2, None), x.dtype))
    def stacked(x):
        return jnp.concatenate([x, x], axis=0)

    assert stacked(torch.randn(3, 5)).shape == (6, 5)


def test_jax_errors_keep_their_message_and_bad_arguments_are_explained():
    @tpunb.jax_op
    def matmul(a, b):
        return a @ b

    with pytest.raises(TypeError, match="dot_general requires contracting dimensions to have the same shape"):
        matmul(torch.randn(2, 3), torch.randn(4, 5))
    with pytest.raises(JaxOpError, match="hashable static values"):
        gelu_scale(torch.randn(2), scale=[1.0])
    with pytest.raises(JaxOpError, match="needs at least one torch tensor"):
        gelu_scale(1.0)


def test_redefining_an_op_like_rerunning_a_cell_registers_a_new_one():
    def twice(x):
        return x * 2

    first, second = tpunb.jax_op(twice), tpunb.jax_op(twice)
    assert repr(first) == "<tpunb.jax_op tpunb_jax.twice>"
    assert repr(second).startswith("<tpunb.jax_op tpunb_jax.twice_")
    torch.testing.assert_close(second(torch.ones(3)), torch.full((3,), 2.0))


def test_without_jax_importing_tpunb_works_and_jax_op_says_how_to_install():
    program = (
        "import sys; sys.modules['jax'] = None\n"  # what an environment without JAX looks like
        "import tpunb\n"
        "try:\n    tpunb.jax_op(lambda x: x)\n"
        "except ImportError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == (
        "tpunb.jax_op needs JAX, which is not installed: pip install 'tpunb[jax]' (or pip install jax)"
    )


def test_the_bridge_refuses_devices_it_cannot_hand_to_jax():
    """JAX never gets memory it cannot read: a device without a bridge is refused by name."""
    with pytest.raises(
        JaxOpError, match=r"cannot hand meta tensors to JAX \(it runs on cpu, cuda, xla and tpu"
    ):
        bridge.to_jax(torch.empty(2, device="meta"))


def test_torch_compile_pins_the_sizes_a_jax_op_sees():
    """A second shape makes Dynamo try symbolic sizes; JAX traces concrete ones, so the op pins
    them (a guard per shape, as JAX compiles per shape anyway)."""
    compiled = torch.compile(lambda t: gelu_scale(t).sum(), backend="aot_eager", fullgraph=True)
    for columns in (8, 9, 10):
        x = torch.randn(4, columns)
        torch.testing.assert_close(compiled(x), gelu_scale_reference(x).sum())
