"""``tpunb.jax_op`` with the real torch_tpu package (no chip): the ops tpunb hands to
``torch.tpu.pallas.jax_op`` register, and TorchTPU's own shape functions agree with tpunb's.

Running them needs ``tpu`` tensors, so a chip; this host has none (README: untested there).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tpunb
from tpunb.jaxops.op import _split
from tpunb.jaxops.torchtpu_bridge import register_with_torchtpu

jax = pytest.importorskip("jax", reason="make test-torchtpu installs jax")


@tpunb.jax_op
def scaled_pair(x, y, scale=2.0):
    return jax.nn.gelu(x) * scale, x + y


def test_the_native_path_still_runs_with_torch_tpu_loaded():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    first, second = scaled_pair(x, y, scale=3.0)
    torch.testing.assert_close(first, torch.nn.functional.gelu(x, approximate="tanh") * 3.0)
    torch.testing.assert_close(second, x + y)


def test_forward_and_vjp_register_with_torchtpu_and_agree_on_shapes():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    tensors, shape = _split((x, y), {"scale": 3.0})
    index = scaled_pair._variant_index(shape)
    variant = scaled_pair._variants[index]
    forward = register_with_torchtpu("tpunb_tpu::probe_fwd", variant.forward)
    vjp = register_with_torchtpu("tpunb_tpu::probe_vjp", lambda *xs: variant.vjp(xs[:2], xs[2:]))
    assert str(forward._opoverload._schema).endswith("(Tensor[] xs) -> Tensor[]")
    _, traced = scaled_pair._trace(index, tensors)
    with FakeTensorMode():
        fake_in = [torch.empty(4, 8), torch.empty(4, 8)]
        outputs = forward(fake_in)
        grads = vjp([*fake_in, torch.empty(4, 8), torch.empty(4, 8)])
    assert [(tuple(o.shape), o.dtype) for o in outputs] == traced
    assert [tuple(g.shape) for g in grads] == [(4, 8), (4, 8)]
