"""Which process-group backend and device a worker uses, per runtime.

``auto`` follows the runtime the notebook runs on: gloo on the CPU, nccl on CUDA, torch_xla's
``xla`` backend on PyTorch/XLA and TorchTPU's ``tpu`` backend on TorchTPU. Each of those
plugs into torch.distributed, so DDP, FSDP2 and the rest work unchanged on top.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("auto", "gloo", "nccl", "xla", "tpu")


def auto_backend(runtime_name: str, device: str) -> str:
    if runtime_name == "xla":
        return "xla"
    if runtime_name == "torchtpu":
        return "tpu"
    return "nccl" if device.startswith("cuda") else "gloo"


def init_worker(backend: str, local_rank: int) -> Any:
    """Initialise the process group from the launcher's environment; the rank's device."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    if backend == "xla":
        import torch_xla
        import torch_xla.distributed.xla_backend  # registers the "xla" backend

        dist.init_process_group("xla", init_method="xla://")
        return torch_xla.device()
    if backend == "tpu":
        dist.init_process_group("tpu")
        return torch.device("tpu", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")
