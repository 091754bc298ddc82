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


def fused_slower(groups: Sequence[FusionGroup]) -> str | None:
    """Why fused was slower than plain PyTorch for these groups, or None.

    Compared over the compiled groups (hits) whose ops were also seen running one by one
    (their first sighting replays them: about what strict mode costs): recording plus the
    compiled run against that replay.
    """
    judged = [g for g in groups if g.status == "hit" and g.eager_ms is not None]
    if not judged:
        return None
    capture = sum(g.capture_ms for g in judged)
    run = sum(g.run_ms for g in judged)
    eager = sum(g.eager_ms for g in judged if g.eager_ms is not None)
    if capture < NOTICEABLE_MS or capture + run <= eager:
        return None
    per = len(judged)
    ops = round(sum(g.ops for g in judged) / per)
    return (
        f"fused is slower here: {capture / per:.1f} ms capturing and {run / per:.1f} ms running "
        f"{ops} small ops per group vs {eager / per:.1f} ms to run them one by one; try %tpu_mode compile"
    )
