"""The PyTorch/XLA suite: real torch_xla on its CPU PJRT device, through real kernels.

It runs in its own virtual environment (``make test-xla``: torch 2.9.0 + torch_xla 2.9.0),
because torch_xla pins torch to its own release; tests/conftest.py leaves this folder out
wherever torch_xla is not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))

from tpunb_kernels import Kernel
from xla_kernels import start_xla_kernel


@pytest.fixture(scope="module")
def xla_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel for a module's tests (torch_xla takes seconds to start); tests use their
    own variable names and read per-cell deltas, so they do not depend on each other."""
    kernel = start_xla_kernel(tmp_path_factory.mktemp("xla-kernel"))
    yield kernel
    kernel.shutdown()
