"""Starting a kernel on the xla runtime (torch_xla's CPU PJRT device)."""

from __future__ import annotations

from pathlib import Path

from tpunb_kernels import Kernel, start_kernel

XLA_ENV = {"TPUNB_RUNTIME": "xla", "PJRT_DEVICE": "CPU"}


def start_xla_kernel(tmp_dir: Path, env: dict[str, str] | None = None) -> Kernel:
    """A kernel on the xla runtime with tpunb loaded and torch imported."""
    kernel = start_kernel(tmp_dir, env={**XLA_ENV, **(env or {})})
    loaded = kernel.run("%load_ext tpunb\nimport torch, tpunb, torch_xla", timeout=300)
    assert loaded.error is None, loaded.error
    assert "xla runtime on xla:0" in loaded.stdout, loaded.stdout
    return kernel
