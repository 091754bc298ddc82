"""``Module.to(device)`` keeps each parameter the object it was, on TorchTPU and PyTorch/XLA.

PyTorch moves a module's parameters in place (``param.data = moved``) where the two tensor
types allow it (CPU to CUDA), and otherwise makes a new ``Parameter`` at every place a
parameter sits. TorchTPU's and PyTorch/XLA's tensors are of the second kind, so
``model.to(DEVICE)`` unties tied weights: GPT-2's output layer and its token embedding become
two parameters, trained apart. Measured on a v5e: strict's GPT-2 losses on the chip were the
CPU's for an untied model (5.4389 at step 2 against the untied CPU's 5.4401, the tied CPU's
5.4714), and notebook 03 counted 162.8 M parameters where the CPU counts 134.5 M (SmolLM2's
embedding twice). An optimizer made before the move is left holding the CPU tensors too.

So with either runtime tpunb turns on PyTorch's own remedy for the process,
``torch.__future__.set_swap_module_params_on_conversion(True)``: each moved tensor is swapped
into the parameter object, which keeps ties and the optimizer's references, as a move to CUDA
does. PyTorch refuses such a swap for a parameter something else holds a weak reference to,
with ``_apply(): Couldn't swap``; ``torch.__future__.set_swap_module_params_on_conversion(False)``
brings back its default (and the untying).
"""

from __future__ import annotations

from typing import Any


def keep_parameters_when_moved(torch: Any) -> None:
    """For the rest of the process (the runtime lives as long); called on the notebook thread."""
    torch.__future__.set_swap_module_params_on_conversion(True)
