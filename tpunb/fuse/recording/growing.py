"""Inputs that grow by the same step every time a group comes back: decode loops.

Generation appends one token per step (``torch.cat([input_ids, next_tokens[:, None]], -1)``),
so the op that reads the token history sees it one longer at every step. Recorded into the
step's group, it gives the group a new input shape, so a new key, at every step: nothing
compiles and every step pays a first sighting. Such an op is better run eagerly, outside the
group: the rest of the step then has the same shapes at every step, becomes one group, and
compiles once.

An op location (the op and the user's line that issues it) is marked once it has seen one
input grow along one dimension by the same positive amount ``GROWING_AFTER`` times in a
row, where that input is the engine's own result (the history the loop feeds back to
itself). Data from outside is never marked, even when it grows steadily (batches sorted by
length): those groups keep compiling per shape, as before, and padding is the fix for them
(notebook 05). Sizes that vary but not steadily are never marked either.
"""

from __future__ import annotations

from types import CodeType
from typing import Any

from tpunb.fuse import config
from tpunb.fuse.recording.trace import Input, OpRecord, Trace

Location = tuple[Any, CodeType | None, int]  # (op overload, the user's code object, line)


def readers(trace: Trace, index: int) -> list[OpRecord]:
    """The ops of ``trace`` that take input ``index`` as an argument."""
    return [op for op in trace.ops if op.reads(Input(index))]


def steady_growth(old_shape: tuple, new_shape: tuple) -> tuple | None:
    """The per-dimension growth when exactly one dimension grew; None otherwise."""
    if len(old_shape) != len(new_shape):
        return None
    growth = tuple(new - old for old, new in zip(old_shape, new_shape, strict=True))
    changed = [g for g in growth if g]
    return growth if len(changed) == 1 and changed[0] > 0 else None


class GrowingInputs:
    """The op locations that run outside groups because their input grows every step."""

    def __init__(self) -> None:
        self.locations: set[Location] = set()
        self._runs: dict[Location, tuple[tuple, int]] = {}  # growth seen last, how often in a row

    def observe(self, previous_metas: tuple, trace: Trace) -> None:
        """After a miss against ``previous_metas`` (the last key of the same op sequence)."""
        if len(previous_metas) != len(trace.input_metas):
            return
        for index, (old, new) in enumerate(zip(previous_metas, trace.input_metas, strict=True)):
            growth = steady_growth(old[0], new[0])
            if growth is None or not trace.input_wrapped[index]:
                continue
            for op in readers(trace, index):
                where = (op.func, op.code, op.line)
                last = self._runs.get(where)
                count = last[1] + 1 if last is not None and last[0] == growth else 1
                self._runs[where] = (growth, count)
                if count >= config.GROWING_AFTER:
                    self.locations.add(where)

    def covers(self, func: Any, code: CodeType | None, line: int) -> bool:
        """Whether this op, issued at this line, runs outside groups (cheap while none does)."""
        return bool(self.locations) and (func, code, line) in self.locations
