"""Advice from measurements: when fused mode cannot pay for itself, or another mode ran the
same code faster.

Fused mode records each op in Python before anything runs, a few microseconds an op. A step
of many tiny ops (a small model at a small batch) can spend more recording than running its
ops one by one would take; the user should hear so once per cell, with the fix, rather than
find out by timing. And a cell the session has seen run in another mode is compared with that
run: the only recommendation of a mode tpunb makes is of one it measured faster.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tpunb.events import FusionGroup

#: Say nothing about cells whose groups recorded for less than this in all.
NOTICEABLE_MS = 5.0
#: How much slower than its ops run one by one a cell's groups must be before tpunb says so.
SLOWER_BY = 1.2


def fused_slower(groups: Sequence[FusionGroup], *, compiled: bool) -> str | None:
    """Why fused was slower than plain PyTorch for this cell's groups, or None.

    A cell that compiled (``compiled``: its groups, its hot calls, a ``--sync-compile`` flush
    or a warm-up inside it) is not judged: its time holds compiles later runs reuse (a 5.6 s
    compile was once reported as 5.6 s of "running").

    Measured, not guessed, without a strict run of the cell: each recorded group's ops ran
    one by one once (its first sighting replays them: what strict mode costs, ``eager_ms``),
    and a module call or optimizer step compiled whole ran eagerly before its compile paid
    off (its median eager run, ``eager_ms`` on its row); over everything of the cell that has
    that figure, recording plus running (compiled or op by op) is set against it. Only strict
    is recommended, because only strict was measured; compile mode is left to a measurement.

    Groups recorded while a module turned hot (``WARMING``) are not judged: they were the
    cell's first steps, and do not come back (its later calls run compiled whole).
    """
    from tpunb.fuse.groups.plan import WARMING  # (only fused cells have groups: the engine is loaded)

    judged = [g for g in groups if g.eager_ms is not None and g.plan != WARMING]
    if compiled or not judged:
        return None
    recorded = [g for g in judged if not g.whole_call]
    calls = [g for g in judged if g.whole_call]
    capture = sum(g.capture_ms for g in judged)
    run = sum(g.run_ms for g in judged)
    eager = sum(g.eager_ms for g in judged if g.eager_ms is not None)
    if capture + run - eager < NOTICEABLE_MS or capture + run <= eager * SLOWER_BY:
        return None
    parts = []
    if recorded:
        ops = sum(g.ops for g in recorded)
        parts.append(
            f"{plural(len(recorded), 'group')} spent {capture:.1f} ms recording {ops} ops and "
            f"{sum(g.run_ms for g in recorded):.1f} ms running them"
        )
    if calls:
        calls_ms = sum(g.run_ms for g in calls)
        parts.append(f"{plural(len(calls), 'call')} compiled whole took {calls_ms:.1f} ms")
    return (
        f"fused is slower here: {' and '.join(parts)}; one by one, as strict mode runs them, they "
        f"took {eager:.1f} ms. Run this cell in strict mode (%%tpu_mode strict), or measure compile "
        "mode first (%%tpu_profile --mode compile)"
    )


#: The runtime counter of the fused engine's own time around what it ran as strict mode runs it.
OVERHEAD_COUNTER = "fused overhead s"
#: The share of a cell's time that engine overhead must reach before tpunb says so.
OVERHEAD_SHARE = 0.03


def fused_overhead(overhead_s: float, wall_s: float) -> str | None:
    """What fused mode added to a cell whose calls and steps it ran as strict mode runs them
    (hot ones waiting for a compile to pay off), or None where it is not noticeable.

    Such a loop cannot be faster than strict's, and its steps pay the engine's wrappers (a
    ~15 us lower bound a step, measured: the wrappers' own clocks; torch's module-hook path
    and the rest are not counted, about as much again): a 0.3 ms step of a small MLP runs
    0.9x strict's speed. Said once the measured part is noticeable, whatever the groups say."""
    if overhead_s < NOTICEABLE_S or overhead_s < wall_s * OVERHEAD_SHARE:
        return None
    return (
        f"fused is slower here: its own work around the calls and optimizer steps it ran as "
        f"strict mode runs them took at least {overhead_s * 1000:.0f} ms of this cell's "
        f"{wall_s:.2f} s ({overhead_s / wall_s:.0%}); steps this small run faster in strict mode "
        "(%%tpu_mode strict)"
    )


#: The runtime counter of what compiling cost a fused cell's steps (fuse/hot/step_clock.py).
COMPILE_COST_COUNTER = "fused compile cost s"


def fused_compile_cost(cost_s: float, wall_s: float) -> str | None:
    """What compiling cost a fused cell that captured a model (Dynamo on this thread, then its
    steps beside the worker's compile), measured against the cell's own steps before the
    capture, or None where it is not noticeable: said without a strict run of the cell, since
    a first run of the HF Trainer took 3-3.6x strict's time while naming only the capture."""
    if cost_s < NOTICEABLE_S or wall_s <= (wall_s - cost_s) * SLOWER_BY:
        return None
    return (
        f"fused is slower here: compiling took {cost_s:.2f} s of this cell's {wall_s:.2f} s "
        "(Dynamo's capture on this thread, then the steps beside the compile worker, against the "
        f"steps before it); as strict mode runs it, about {wall_s - cost_s:.2f} s. Later runs of "
        "the cell reuse what compiled"
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


#: A cell must be at least this much slower than the same code in another mode to be told so.
NOTICEABLE_S = 0.05
#: Modes a cell's time is compared across (debug is slow on purpose, and never recommended).
COMPARED_MODES = ("strict", "fused", "compile")
_MODE_LINE = re.compile(r"^\s*%%tpu_mode\b[^\n]*\n?")


class CellTimes:
    """How long the session saw the same code take in each mode: the measurement behind
    "another mode is faster here". The code is the cell's text without a ``%%tpu_mode``
    line, so a cell re-run in another mode is the same code; its precision is part of it."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], dict[str, tuple[float, int | None]]] = {}

    @staticmethod
    def code_of(source: str) -> str:
        return _MODE_LINE.sub("", source, count=1).strip()

    def slower_than_seen(
        self, source: str, precision: str, mode: str, wall_s: float, *, compiled: bool
    ) -> str | None:
        """The fastest mode the session saw run this code faster than ``wall_s``, in words.

        ``compiled``: this run compiled (compile mode's graphs, fused mode's groups and hot
        calls, in the background or not). Its time then holds work that later runs of the
        cell reuse (measured: a 3000-step GPT loop, fused 21 s the first time against strict's
        11 s, then 9.6 s), so the other mode is not recommended on its strength yet."""
        if mode not in COMPARED_MODES:
            return None
        seen = self._seen.get((self.code_of(source), precision), {})
        faster = [
            (other, seconds, cell)
            for other, (seconds, cell) in seen.items()
            if other != mode and wall_s > seconds * SLOWER_BY and wall_s - seconds >= NOTICEABLE_S
        ]
        if not faster:
            return None
        other, seconds, cell = min(faster, key=lambda item: item[1])
        where = f" (In[{cell}])" if cell is not None else ""
        measured = (
            f"{mode} is slower here: this cell took {wall_s:.2f} s; {other} mode ran the same code in "
            f"{seconds:.2f} s{where}."
        )
        if compiled:
            reuse = "This run compiled what later runs of it reuse"
            return f"{measured} {reuse}: time one before choosing {other} mode"
        return f"{measured} Run it in {other} mode (%%tpu_mode {other})"

    def record(self, source: str, precision: str, mode: str, wall_s: float, cell: int | None) -> None:
        if mode in COMPARED_MODES and self.code_of(source):
            self._seen.setdefault((self.code_of(source), precision), {})[mode] = (wall_s, cell)
