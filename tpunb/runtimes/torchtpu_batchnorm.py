"""BatchNorm's running statistics on TorchTPU, kept as PyTorch keeps them.

Measured on a TPU v5e (torch_tpu 0.2.0, libtpu 0.0.51, strict mode, no tpunb): ``F.batch_norm``
in training mode normalises with the batch's statistics as the CPU does (output within 3e-7),
but leaves ``running_mean`` and ``running_var`` as they were: against the CPU's update they
differ by 0.714 and 0.065 (relative norm), exactly what no update at all gives. A model trained
on the chip then evaluates with the statistics it started with: MobileNetV2 fine-tuned on MNIST
for 30 steps scored 0.40 in eval mode on the chip against 0.80 on the CPU (0.80 against 0.86
with the batch's own statistics), and notebook 04 fell short of its accuracies in every mode.

So on a TorchTPU chip tpunb watches every ``_BatchNorm`` module (BatchNorm1d/2d/3d, their lazy
and sync forms) that runs in training mode on the TPU, and, where a probe shows TorchTPU left a
batch's statistics out, folds them in after the call as ``_BatchNorm.forward`` would have:
``momentum``'s exponential average (or the cumulative average when ``momentum`` is None), the
variance unbiased. The probe is one two-element ``batch_norm`` per eager mode, the first time a
module needs it, so a TorchTPU that updates them itself is left alone. Graphs Dynamo traces
(compile mode) are left as TorchTPU compiles them: not measured there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fold_in_batch_statistics(module: Any, batch: Any) -> None:
    """Update ``module``'s running statistics with ``batch``'s, as PyTorch's training-mode
    ``batch_norm`` does (called after the module counted the batch in ``num_batches_tracked``).

    The statistics are updated through ``.data``, which has a version counter of its own:
    autograd saved them for the backward of the call that just ran (``batch_norm``'s backward
    takes them), and an update it can see fails that backward (on the chip: "modified by an
    inplace operation"), where PyTorch's own update is part of the op."""
    import torch

    with torch.no_grad():
        values = batch.detach().float()
        dims = [0, *range(2, values.dim())]
        mean = values.mean(dims)
        variance = values.var(dims, correction=1)
        for running, value in ((module.running_mean, mean), (module.running_var, variance)):
            factor = module.momentum
            if factor is None:  # the cumulative average, as a tensor: no read from the device
                factor = module.num_batches_tracked.reciprocal().to(running.dtype)
            running.data.lerp_(value.to(running.dtype), factor)


def leaves_running_statistics(device: str) -> bool:
    """Whether training-mode ``batch_norm`` on ``device`` leaves the running mean unchanged (one
    two-element call: PyTorch's update with momentum 1 makes it the batch's mean, 2)."""
    import torch

    with torch.no_grad():
        running_mean = torch.zeros(1, device=device)
        batch = torch.tensor([[1.0], [3.0]], device=device)
        torch.nn.functional.batch_norm(
            batch, running_mean, torch.ones(1, device=device), training=True, momentum=1.0
        )
        return float(running_mean.cpu()) == 0.0


class RunningStatistics:
    """The global forward hook that keeps BatchNorm's running statistics on ``device_type``;
    ``eager_mode`` names the runtime's current eager mode (each is probed once)."""

    def __init__(self, device_type: str, eager_mode: Callable[[], str]) -> None:
        import torch
        from torch.nn.modules.batchnorm import _BatchNorm

        self.device_type = device_type
        self._eager_mode = eager_mode
        self._leaves: dict[str, bool] = {}  # eager mode -> whether the runtime leaves them
        self._handle: Any = None
        # looked up once: the hook runs after every module call in the process
        self._batch_norm = _BatchNorm
        self._compiling = torch.compiler.is_compiling

    def install(self) -> None:
        """For the rest of the process (the runtime lives as long)."""
        import torch

        if self._handle is None:
            self._handle = torch.nn.modules.module.register_module_forward_hook(self._after_forward)

    def _after_forward(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if not isinstance(module, self._batch_norm) or not module.training or module.running_mean is None:
            return
        if self._compiling() or not args or getattr(args[0], "device", None) is None:
            return
        if args[0].device.type != self.device_type or not self._runtime_leaves_them():
            return
        fold_in_batch_statistics(module, args[0])

    def _runtime_leaves_them(self) -> bool:
        mode = self._eager_mode()
        if mode not in self._leaves:
            self._leaves[mode] = leaves_running_statistics(self.device_type)
        return self._leaves[mode]
