"""Which runtime a kernel should use, and why.

Order: ``TPUNB_RUNTIME`` if set; else TorchTPU when installed and a TPU chip is on the PCI
bus; else PyTorch/XLA when installed and there is a device for it (a TPU, or ``PJRT_DEVICE``
set, which is how torch_xla is pointed at its CPU or GPU client); else native on CUDA when
available; else native on the CPU. Nothing here imports a TPU package.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tpunb.runtimes.base import RuntimeUnavailable
from tpunb.runtimes.hardware import TpuHardware, scan_tpu

RUNTIME_NAMES = ("native", "xla", "torchtpu")
ENV_VAR = "TPUNB_RUNTIME"


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime to use and the reason, in words a user can check."""

    name: str
    reason: str
    explicit: bool = False  # chosen by TPUNB_RUNTIME rather than detected


def installed(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def cuda_device_name() -> str | None:
    """The first CUDA device's name, or None (imports torch, which a kernel needs anyway)."""
    if not installed("torch"):
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def chips_found(tpu: TpuHardware) -> str:
    """``1 TPU chip found``, and where the bus shows more than this machine can use, how many."""
    found = f"{tpu.chips} TPU chip{'s' if tpu.chips != 1 else ''} found"
    return f"{found} (the PCI bus shows {tpu.on_bus})" if tpu.on_bus > tpu.chips else found


def detect_runtime(env: Mapping[str, str] | None = None, tpu: TpuHardware | None = None) -> RuntimeChoice:
    env = os.environ if env is None else env
    requested = env.get(ENV_VAR, "").strip().lower()
    if requested:
        if requested not in RUNTIME_NAMES:
            raise RuntimeUnavailable(
                f"{ENV_VAR}={env[ENV_VAR]!r} is not a runtime; accepted: {', '.join(RUNTIME_NAMES)}"
            )
        return RuntimeChoice(requested, f"{ENV_VAR}={requested}", explicit=True)
    tpu = scan_tpu() if tpu is None else tpu
    if tpu.chips and installed("torch_tpu"):
        return RuntimeChoice("torchtpu", f"torch_tpu installed and {chips_found(tpu)}")
    if installed("torch_xla"):
        if tpu.present:
            return RuntimeChoice("xla", "torch_xla installed and a TPU found")
        if env.get("PJRT_DEVICE"):
            return RuntimeChoice("xla", f"torch_xla installed and PJRT_DEVICE={env['PJRT_DEVICE']}")
    name = cuda_device_name()
    if name:
        return RuntimeChoice("native", f"CUDA device found ({name})")
    if tpu.present:
        return RuntimeChoice("native", "a TPU is present but neither torch_tpu nor torch_xla is installed")
    if installed("torch_tpu"):
        return RuntimeChoice("native", "torch_tpu is installed but no TPU present: CPU")
    return RuntimeChoice("native", "no TPU runtime and no CUDA device found: CPU")
