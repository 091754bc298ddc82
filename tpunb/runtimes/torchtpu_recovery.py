"""After a cell fails on the chip: say what happened, restore what TorchTPU lets us restore,
and name what is lost (device_failures.py has the runtime-neutral half).

What TorchTPU 0.2.0 keeps broken after a failed computation, and what brings it back:

* the tensors the computation was to write hold a failed buffer for good (a model's parameters
  after a failed optimizer step); only re-creating them helps, so tpunb names them and the
  cells that make them;
* the device's random generator is a device tensor updated by the computations that draw; if
  one of those failed, every later ``torch.randn`` on the chip fails: re-seeding writes a fresh
  state (tpunb re-seeds from ``torch.initial_seed()`` and says so);
* an ``_assert_async`` that failed sets a process-wide "sticky" error that fails every later op;
  TorchTPU's testing module clears it.

Measured on a v5e: an out-of-memory (at compile time, or an allocation at run time) in strict or
fused mode left new tensors, the generator and earlier tensors working.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from tpunb.device_failures import OOM_ADVICE, Failure, classify, find_lost, remake_advice
from tpunb.report import format_bytes
from tpunb.runtimes.base import MemoryInfo


class TpuRecovery:
    """Remembers the failure that lost values, so later cells that use one are told."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        #: the cell that lost values, how, and its error's text (a lost value read later
        #: raises that same text, or "a required argument is in a failed state")
        self.since: tuple[int | None, Failure, str] | None = None

    def after_failure(
        self, error: BaseException, namespace: Mapping[str, Any], cell: int | None, memory: MemoryInfo | None
    ) -> list[str]:
        failure = classify(error)
        if failure is None:
            return []
        earlier = self.since if self.since is not None and _uses_lost(failure, error, self.since) else None
        lines = [_used_lost(earlier) if earlier is not None else _what_happened(failure, memory)]
        restored = self._restore()
        lost = find_lost(namespace, self._is_lost, "tpu")
        if lost:
            if earlier is None:
                self.since = (cell, failure, str(error))
            advice = remake_advice(lost, namespace.get("In"), cell)
            lines.append(f"{'still lost' if earlier else 'lost with it'}: {lost.words()}{advice}")
        else:
            self.since = None
            whole = earlier is not None or failure.kind == "a failed computation"
            lines.append(
                "nothing in the notebook's variables is lost now: run the cell again"
                if whole
                else "the notebook's other tensors are intact: later cells run as before"
            )
        if restored:
            lines.append(f"restored: {'; '.join(restored)}")
        return lines

    def _is_lost(self, tensor: Any) -> bool:
        """Whether reading one element of ``tensor`` fails (its buffer is in a failed state)."""
        if tensor.numel() == 0:
            return False
        try:
            tensor.detach()[(0,) * tensor.dim()].cpu()
        except Exception:  # "a required argument is in a failed state", or the failure's own text
            return True
        return False

    def _restore(self) -> list[str]:
        """Clear TorchTPU's sticky error and re-seed a failed random generator; what was done."""
        done = []
        testing = _testing()
        if testing is not None and testing.has_sticky_error():
            testing.clear_sticky_error()
            done.append("TorchTPU's failed-assertion state, cleared")
        if not self._draws():
            seed = self._torch.initial_seed()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="<TorchTpu/ApiStage/")
                self._torch.tpu.manual_seed(seed)
            if self._draws():
                done.append(f"the TPU's random generator, re-seeded with torch.initial_seed() ({seed})")
        return done

    def _draws(self) -> bool:
        """Whether the chip's generator still draws; its state is put back afterwards, so
        checking leaves the notebook's random stream where it was."""
        try:
            with self._torch.random.fork_rng(device_type="tpu"):
                self._torch.rand(1, device="tpu").cpu()
        except Exception:  # its state is a failed buffer: saving or drawing fails
            return False
        return True


def _uses_lost(failure: Failure, error: BaseException, since: tuple[int | None, Failure, str]) -> bool:
    """Whether a cell failed for reading a value lost earlier rather than failing anew."""
    return failure.kind == "a failed computation" or str(error) == since[2]


def _used_lost(since: tuple[int | None, Failure, str]) -> str:
    origin, first, _ = since
    where = f"Cell In[{origin}]" if origin is not None else "an earlier cell"
    cause = f"{first.kind}: {first.detail}" if first.detail else first.kind
    return f"this cell used a value lost when {where} failed ({cause})"


def _what_happened(failure: Failure, memory: MemoryInfo | None) -> str:
    if failure.out_of_memory:
        figures = f": {failure.detail}" if failure.detail else ""
        if memory is not None and memory.peak is not None and memory.limit is not None:
            peak, limit = format_bytes(memory.peak), format_bytes(memory.limit)
            figures += f" (HBM peak in this cell {peak} of {limit})"
        return f"the TPU ran out of memory in this cell{figures}; {OOM_ADVICE}"
    if failure.kind == "a failed computation":
        return "this cell used a value whose computation failed earlier"
    return f"{failure.kind} in this cell"


def _testing() -> Any:
    """TorchTPU's testing helpers (the only place that clears its sticky error), if present."""
    try:
        from torch_tpu._internal import testing
    except ImportError:
        return None
    return testing if hasattr(testing, "has_sticky_error") else None
