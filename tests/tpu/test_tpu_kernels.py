"""JAX and Pallas on the chip: a ``@tpunb.jax_op`` forward and backward on ``tpu`` tensors, and
a Pallas kernel compiled by Mosaic (TorchTPU's ``torch.tpu.pallas.jax_op`` runs both)."""

from __future__ import annotations


def test_a_jax_op_runs_forward_and_backward_on_the_chip(cells) -> None:
    cells.ok("""
import jax

@tpunb.jax_op
def gelu_scale(x, scale=2.0):
    return jax.nn.gelu(x) * scale

t = torch.randn(8, 128, device=DEVICE, requires_grad=True)
out = gelu_scale(t, scale=3.0)
out.sum().backward()
reference = torch.nn.functional.gelu(t.detach().cpu(), approximate="tanh") * 3.0
forward_error = (out.detach().cpu() - reference).abs().max().item()
has_grad = t.grad is not None and bool(torch.isfinite(t.grad).all())
""")
    assert cells.value("forward_error") < 1e-2 and cells.value("has_grad")


def test_a_pallas_kernel_compiles_and_runs_on_the_chip(cells) -> None:
    cells.ok("""
import jax

def add_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

@tpunb.jax_op
def plus_one(x):
    return tpunb.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

plus = plus_one(torch.ones(8, 128, device=DEVICE)).cpu()
""")
    assert cells.value("bool((plus == 2).all())")
