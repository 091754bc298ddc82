"""Advice from what a cell's groups cost: when fused mode cannot pay for itself.

Fused mode records each op in Python before anything runs, a few microseconds an op. A step
of many tiny ops (a small model at a small batch) can spend more recording than running its
ops one by one would take; the user should hear so once per cell, with the fix, rather than
find out by timing.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpunb.events import FusionGroup

#: Say nothing about cells whose groups recorded for less than this in all.
NOTICEABLE_MS = 5.0
#: How much slower than its ops run one by one a cell's groups must be before tpunb says so.
SLOWER_BY = 1.2


def fused_slower(groups: Sequence[FusionGroup]) -> str | None:
    """Why fused was slower than plain PyTorch for this cell's groups, or None.

    Measured, not guessed: each group's ops ran one by one once (its first sighting replays
    them: what strict mode costs, ``eager_ms``); over every group of the cell that has that
    figure, recording plus running (compiled or op by op) is set against it. Only strict is
    recommended, because only strict was measured; compile mode is left to a measurement.

    A cell whose modules ran compiled whole (hot calls) is not judged by its recorded groups:
    those were its first steps, recorded while the modules turned hot, and do not come back.
    """
    judged = [g for g in groups if g.eager_ms is not None]
    if not judged or any(g.whole_call for g in groups):
        return None
    capture = sum(g.capture_ms for g in judged)
    run = sum(g.run_ms for g in judged)
    eager = sum(g.eager_ms for g in judged if g.eager_ms is not None)
    if capture < NOTICEABLE_MS or capture + run <= eager * SLOWER_BY:
        return None
    count = f"{len(judged)} group{'s' if len(judged) != 1 else ''}"
    ops = sum(g.ops for g in judged)
    return (
        f"fused is slower here: {count} spent {capture:.1f} ms recording {ops} ops and "
        f"{run:.1f} ms running them; one by one, as strict mode runs them, they took {eager:.1f} ms. "
        "Run this cell in strict mode (%%tpu_mode strict), or measure compile mode first "
        "(%%tpu_profile --mode compile)"
    )
