"""Adopting and releasing tensors in place (tpunb/fuse/recording/adopt.py) is all or nothing: a swap
torch refuses halfway leaves the tensor exactly as it was."""

from __future__ import annotations

import gc

import torch
from torch.profiler import profile

from tpunb.fuse import DeferredTensor, FusionEngine
from tpunb.fuse.recording.adopt import adopt_tensor, release_tensor


def test_a_swap_refused_under_the_profiler_leaves_the_tensor_usable():
    engine = FusionEngine(torch.device("cpu"))
    weight = torch.nn.Parameter(torch.ones(4, 4))
    assert adopt_tensor(weight, engine) == 1 and type(weight) is DeferredTensor
    # record_shapes holds every tensor an op touched weakly: torch refuses the C++ swap
    # after it has swapped the Python class, which the release must undo
    with profile(record_shapes=True) as trace:
        (weight * 2).sum()
        assert release_tensor(weight) is False
    assert type(weight) is DeferredTensor and torch.equal(weight * 1, torch.ones(4, 4))
    del trace
    gc.collect()
    assert release_tensor(weight) is True  # once the profiler's results are gone
    assert type(weight) is torch.nn.Parameter and float(weight.detach().sum()) == 16.0
