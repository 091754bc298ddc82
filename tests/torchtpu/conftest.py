"""The TorchTPU suite: the real ``torch_tpu`` package (0.2.0 on torch 2.13, CPU-only host).

It runs in its own virtual environment (``make test-torchtpu``), because torch_tpu loads
itself into every ``import torch`` once installed; tests/conftest.py leaves this folder out
wherever torch_tpu is not installed. Without a chip, TorchTPU's mode API and cache counters
still work, which is what these tests drive; what needs a chip is listed as untested in the
README's compatibility table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))
