"""``tpunb.jax_op`` on real torch_xla (CPU PJRT): the JAX function joins the lazy XLA graph."""

from __future__ import annotations

from tpunb_kernels import Kernel

DEFINE = """
import jax
@tpunb.jax_op
def gelu_scale(x, scale=2.0):
    return jax.nn.gelu(x, approximate=True) * scale
def reference(x, scale=2.0):
    return torch.nn.functional.gelu(x, approximate="tanh") * scale
"""


def test_a_jax_op_on_xla_tensors_is_part_of_the_fused_graph(xla_kernel: Kernel) -> None:
    assert xla_kernel.run(DEFINE).error is None
    code = (
        "%%tpu_mode fused\n"
        "jx = torch.randn(32, 16, device='xla')\n"
        "jy = (gelu_scale(jx * 2, scale=3.0) + 1).sum(dim=1)\n"
    )
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    cell = xla_kernel.value("tpunb.stats()['last_cell']")
    assert cell["counters"]["graphs executed"] == 1  # the JAX op did not cut the group
    assert cell["groups"] == 1
    difference = "float((jy.cpu() - (reference(jx.cpu() * 2, 3.0) + 1).sum(dim=1)).abs().max())"
    assert xla_kernel.value(difference) < 1e-4


def test_gradients_of_a_jax_op_flow_on_xla(xla_kernel: Kernel) -> None:
    assert xla_kernel.run(DEFINE).error is None
    code = (
        "gx = torch.randn(8, 8, device='xla', requires_grad=True)\n"
        "weights = torch.randn(8, 8)\n"
        "(gelu_scale(gx) * weights.to('xla')).sum().backward()\n"
        "cx = gx.detach().cpu().requires_grad_()\n"
        "(reference(cx) * weights).sum().backward()\n"
        "grad_difference = float((gx.grad.cpu() - cx.grad).abs().max())\n"
    )
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    assert xla_kernel.value("grad_difference") < 1e-4
