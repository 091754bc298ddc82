"""Text that tpunb shows people: byte sizes, the load line, the mode table, cell summaries.

Pure functions from data to strings, so the magics stay thin and the wording is tested once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpunb.events import CellRun
from tpunb.modes import MODE_DESCRIPTIONS, Mode
from tpunb.runtimes import (
    CALLS_FLOPS_UNKNOWN,
    CAPTURE_WAITED,
    COMPILED_WHOLE,
    MODEL_FLOPS,
    PARTLY_COMPILED,
    PAST_VERSION_LIMIT,
    STEPS_NOT_COMPILED,
    UNCOMPILED,
    WHILE_COMPILING,
    MemoryInfo,
)

if TYPE_CHECKING:  # report formats what the session holds; it never drives one
    from tpunb.session import Session

#: A compile-mode cell's wait for background compiles shorter than this goes unmentioned.
WAIT_WORTH_SAYING_S = 0.05


def format_bytes(count: int | None) -> str:
    """``1.5 GiB``; unknown figures read ``n/a``, never 0."""
    if count is None:
        return "n/a"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_memory(memory: MemoryInfo | None) -> str:
    if memory is None:
        return "memory n/a"
    return f"{memory.label} {format_bytes(memory.used)} / {format_bytes(memory.limit)}"


def load_line(session: Session, version: str) -> str:
    """The one line ``%load_ext tpunb`` prints."""
    runtime = session.runtime
    return (
        f"tpunb {version} · {runtime.name} runtime on {runtime.device} ({session.choice.reason})"
        f" · {format_memory(runtime.memory())} · mode {session.effective.describe()}"
    )


def mode_table(session: Session) -> str:
    """What ``%tpu_mode`` without arguments prints."""
    rows = [
        f"current mode: {session.effective.describe()} "
        f"(default for new cells: {session.default.describe()}) · "
        f"{session.runtime.name} runtime on {session.runtime.device}",
        "",
        f"  {'mode':<8} {'here':<8} what it does",
    ]
    for mode in Mode:
        available = "yes" if mode in session.runtime.modes else "not yet"
        marker = "*" if mode is session.effective.mode else " "
        rows.append(f"{marker} {mode.value:<8} {available:<8} {MODE_DESCRIPTIONS[mode]}")
    rows += ["", "%tpu_mode MODE sets the default; %%tpu_mode MODE runs one cell in MODE."]
    return "\n".join(rows)


def cell_summary(record: CellRun) -> str:
    """The one-line summary after a cell that ran in a mode other than strict, or in reduced
    precision: the mode, the time and only what happened (no "0 groups" for a cell that fused
    nothing; a graph break with its reason)."""
    parts = [f"[tpunb] {record.mode}"]
    if record.precision != "fp32":
        parts.append(record.precision)
    parts.append(f"{record.wall_s:.2f} s")
    if record.peak_bytes is not None:
        parts.append(f"peak {format_bytes(record.peak_bytes)}")
    if "compile" in record.mode:
        if record.compiled_graphs:  # a cell run again reuses its graphs: "0 graphs" says nothing
            parts.append(
                f"{record.compiled_graphs} graph{'s' if record.compiled_graphs != 1 else ''} compiled"
            )
        if record.graph_breaks:
            count = f"{record.graph_breaks} graph break{'s' if record.graph_breaks != 1 else ''}"
            parts.append(f"{count} ({record.break_reasons})" if record.break_reasons else count)
        uncompiled = counted_part(record.counters, UNCOMPILED)
        if uncompiled:
            parts.append(uncompiled)
        if record.compile_waited_s >= WAIT_WORTH_SAYING_S:
            waited = record.compile_waited_s
            parts.append(f"waited {waited:.2f} s for fused groups compiling in the background")
    for prefix in (COMPILED_WHOLE, WHILE_COMPILING, PARTLY_COMPILED, PAST_VERSION_LIMIT):
        counted = counted_part(record.counters, prefix)
        if counted:
            parts.append(counted)
    waited = capture_wait_part(record.counters)
    if waited:
        parts.append(waited)
    if all_steps_compiled(record.counters) and record.wall_s > 0:
        parts.append(model_flops_part(record.counters[MODEL_FLOPS] / record.wall_s, record.peak_flops))
    if record.groups:
        parts.append(f"{record.groups} group{'s' if record.groups != 1 else ''}")
    if record.recompiles:
        parts.append(f"recompiled: {record.recompiles}")
    if record.cache_hits or record.cache_misses:
        parts.append(f"cache {record.cache_hits} hit / {record.cache_misses} miss")
    if record.error:
        parts.append(f"failed: {record.error}")
    line = " · ".join(parts)
    if record.storm:
        line += f"\n[tpunb] {storm_line(record.storm)}"
    return f"{line}\n[tpunb] {record.slower}" if record.slower else line


def counted_part(counters: dict[str, float], prefix: str) -> str | None:
    """The runtime's counters under ``prefix``, counted: what a compile cell ran uncompiled
    (``ran uncompiled: 6 steps of AdamW, 1 function with tensors off the TPU``), a fused cell's
    calls of a model compiled whole (``compiled whole: 9 calls of GPT2LMHeadModel``)."""
    counted = []
    for key, count in counters.items():
        if key.startswith(prefix) and count > 0:
            head, _, rest = key.removeprefix(prefix).partition(" ")
            noun = f"{head}s {rest}" if count != 1 else f"{head} {rest}"
            counted.append(f"{int(count)} {noun.strip()}")
    return f"{prefix}{', '.join(counted)}" if counted else None


def capture_wait_part(counters: dict[str, float]) -> str | None:
    """The seconds a fused cell waited while Dynamo captured its trained models on the
    notebook's thread, once per model and shape: a wait no compile was asked for (a GPT-2 on a
    v5e: one step of 26.5 s in a 300-step cell), so the line says it."""
    waited = {
        key.removeprefix(CAPTURE_WAITED): seconds
        for key, seconds in counters.items()
        if key.startswith(CAPTURE_WAITED) and seconds > 0
    }
    total = sum(waited.values())
    if total < WAIT_WORTH_SAYING_S:
        return None
    return f"waited {total:.2f} s while Dynamo captured {', '.join(waited)} on this thread"


def all_steps_compiled(counters: dict[str, float]) -> bool:
    """Whether the cell's model FLOPs are all its training's: some ran compiled, none ran before
    its compile (under the runtime's fusion), uncompiled (while compiling, or past Dynamo's limit
    of versions) or partly compiled, and none ran a graph whose FLOPs could not be counted
    (FLOPs not counted in all those). A
    300-step cell whose model compiled at its 225th step would say "MFU 0.2 %" otherwise."""
    uncounted = counters.get(STEPS_NOT_COMPILED, 0) + counters.get(CALLS_FLOPS_UNKNOWN, 0)
    not_compiled = (WHILE_COMPILING, PARTLY_COMPILED, PAST_VERSION_LIMIT)
    partly = uncounted > 0 or any(
        key.startswith(not_compiled) and count > 0 for key, count in counters.items()
    )
    return counters.get(MODEL_FLOPS, 0) > 0 and not partly


def model_flops_part(rate: float, peak: float | None) -> str:
    """The FLOP/s a cell's compiled model calls ran, over the cell's time, against the device's
    peak where known (model FLOPs utilization): ``MFU 19.3 % (38.0 of 197 TFLOP/s)``."""
    if peak:
        return f"MFU {100 * rate / peak:.1f} % ({rate / 1e12:.1f} of {peak / 1e12:.0f} TFLOP/s)"
    return f"{rate / 1e12:.2f} TFLOP/s in compiled model calls"


def storm_line(storm: str) -> str:
    """What a compile cell's stopped recompile storm was, and what to do about it."""
    return (
        f"recompile storm stopped: {storm}. From then on this cell ran a frame uncompiled where it "
        "would have recompiled. A value that changes every step (a step counter, a logged loss, a "
        "learning rate) is guarded in compiled code: compile the model rather than the loop around it "
        "(model = tpunb.compile(model) in a strict cell)"
    )
