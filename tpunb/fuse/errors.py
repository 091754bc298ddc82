"""How fused mode reports failures: the op that failed, where it was recorded, what to do."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from tpunb.debug import out_of_bounds
from tpunb.fuse.recording.deferred import DeferredTensor
from tpunb.fuse.recording.trace import OpRecord, Trace
from tpunb.source import location_of


class ReplayError(Exception):
    """A recorded op failed when its group ran; ``index`` says which, ``args_given`` what it got."""

    def __init__(self, index: int, error: BaseException, args: Sequence[Any] = ()) -> None:
        super().__init__(str(error))
        self.index, self.error, self.args_given = index, error, args


class FusedOpError(RuntimeError):
    """A recorded op failed when its group ran; names the op and where it was recorded."""


def check_not_failed(wrapper: DeferredTensor) -> None:
    error = wrapper.error
    if error is not None:
        detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise FusedOpError(f"this tensor's value was lost when its group failed ({detail})") from error


def op_location(op: OpRecord) -> str:
    return str(location_of(op.code.co_filename, op.line)) if op.code is not None else "(no user frame)"


def describe_failure(trace: Trace, failure: ReplayError) -> str:
    """What failed, where the user recorded it, and for an index out of bounds, which index
    (the op's own message, "index out of range in self", names neither)."""
    op = trace.ops[failure.index]
    found = out_of_bounds(op.func, failure.args_given) if failure.args_given else None
    problem = found[0] if found is not None else failure.error
    where = op_location(op)
    return f"deferred op #{failure.index} {op.func.overloadpacket} failed: {problem}\n  recorded at {where}"


def warn_storm(trace: Trace, variants: int) -> None:
    """Warn once per op sequence, at the user's line that recorded the group's first op."""
    first = trace.ops[0]
    warnings.warn_explicit(
        f"tpunb fused: the group recorded at {op_location(first)} has been compiled for "
        f"{variants} different input shapes; "
        "new shapes now run op by op unless they keep coming back. Give it fixed shapes: pad "
        "or bucket sequences, DataLoader(drop_last=True).",
        RuntimeWarning,
        filename=first.code.co_filename if first.code else "tpunb",
        lineno=first.line,
    )
