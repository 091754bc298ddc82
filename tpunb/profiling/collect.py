"""``tpunb.profile()``: run a block under the runtime's profiler and report what it did.

The block runs in the session's current mode, or in ``mode``. Around it: ``torch.profiler``
(top ops, the Chrome trace), a subscription to the session's event bus (groups, compiles,
compile-mode runs: the bus's history is bounded, a subscription misses nothing), the wait
watcher, the runtime's counters before and after, and its memory. The report is filled in
when the block ends, also when it raises (then the exception goes on, and the report says
it stopped there), and is kept as ``last_profile()``.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tpunb.events import CompiledCell, CompileDone, FusionGroup, GroupStatus, Record
from tpunb.modes import ModeConfig
from tpunb.profiling.findings import Observed, findings
from tpunb.profiling.report import Profile
from tpunb.profiling.torch_trace import Span, TorchTrace
from tpunb.profiling.waits import Wait, WaitWatcher, engine_waits, wait_rows

if TYPE_CHECKING:
    from tpunb.runtimes import Runtime

#: Where traces go when no directory is given.
DEFAULT_TRACE_DIR = Path(tempfile.gettempdir()) / "tpunb-profiles"
#: Top ops a report lists by default.
TOP_OPS = 10

_last: Profile | None = None
_numbers = itertools.count(1)  # tells apart two profiles started in the same second


class ProfileError(ValueError):
    """A profile cannot be taken as asked (a trace directory that cannot be written, a bad count)."""


def trace_directory(path: str | Path | None) -> Path:
    """The directory traces go to, made and checked writable now, before anything runs."""
    directory = Path(path).expanduser() if path is not None else DEFAULT_TRACE_DIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tpunb-probe-"):
            pass
    except OSError as error:
        raise ProfileError(
            f"cannot write traces to {str(directory)!r} ({error.strerror or error}); "
            "pass a directory you can write to, e.g. --trace ./profiles"
        ) from None
    return directory


def last_profile() -> Profile | None:
    """The report of the last ``%%tpu_profile`` cell or ``tpunb.profile()`` block."""
    return _last


class _Records:
    """The session's records published while the block ran (any thread: background compiles)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[Record] = []

    def __call__(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def of(self, kind: type) -> list:
        with self._lock:
            return [r for r in self.records if isinstance(r, kind)]


@contextlib.contextmanager
def profile(
    mode: str | None = None,
    trace: str | Path | None = None,
    top: int | None = None,
    shapes: bool | None = None,
) -> Iterator[Profile]:
    """Profile the block: ``with tpunb.profile() as p: ...``, then ``p.findings``, ``p.top_ops``,
    ``p.plot()``... ``mode`` runs the block in that mode; ``trace`` is where the Chrome trace
    goes (default: a ``tpunb-profiles`` folder in the temporary directory); ``top`` is how
    many ops the report lists (default ``TOP_OPS``); ``shapes`` records the ops' input shapes
    (default: on, but on the native runtime, where it would slow fused mode down:
    torch_trace.py)."""
    global _last
    from tpunb.session import get_session

    top = TOP_OPS if top is None else top
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ProfileError(f"top must be a whole number of ops, 1 or more; got {top!r}")
    session = get_session()
    config = ModeConfig.build(mode) if mode is not None else None
    if config is not None:
        session.check_supported(config)
    directory = trace_directory(trace)
    report = Profile(runtime=session.runtime.name, device=session.runtime.device)
    records, runtime = _Records(), session.runtime
    # compiles earlier cells left running would otherwise finish inside the block, their time
    # (and a compile of the block's that queues behind them) counted as the block's
    report.earlier_compiles_s = runtime.wait_for_background_compiles()
    counters_before = runtime.counters()
    runtime.reset_peak_memory()
    session.bus.subscribe(records)
    watcher = WaitWatcher()
    if shapes is None:  # off where the fused engine swaps tensors in place (torch_trace.py)
        shapes = not runtime.adopts_tensors
    torch_trace = TorchTrace(cuda=str(runtime.device).startswith("cuda"), shapes=shapes)
    stem = directory / f"profile-{int(time.time())}-{next(_numbers)}"
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        # the mode's scope opens and closes outside the profiler: TorchTPU's eager-mode switch
        # breaks torch.profiler's thread state when one spans the other's end
        with session.scoped(config) if config is not None else contextlib.nullcontext():
            report.mode = session.effective.mode.value
            with (
                torch_trace,
                runtime.device_trace(str(stem)) as report.device_trace,
                watcher,  # above the mode's own torch-function modes: it times their syncs too
            ):
                try:
                    yield report
                finally:
                    runtime.run_pending()  # the block's last group runs in the profile
                    runtime.synchronize()
                    report.time_split[COMPILE_WAIT] = _wait_for_compiles(runtime)
    except BaseException as raised:
        error = raised
        raise
    finally:
        session.bus.unsubscribe(records)
        wall_s = time.perf_counter() - started
        try:
            _fill(report, records, watcher.waits, torch_trace, stem, top, wall_s, error, counters_before)
        except Exception as failure:
            if error is None:
                raise
            warnings.warn(
                f"tpunb profile: the report is incomplete ({failure})", RuntimeWarning, stacklevel=3
            )
        _last = report


def _wait_for_compiles(runtime: Runtime) -> float:
    """Let the compiles the block started finish: their time is the block's, and a
    recompile's cost is mostly its compile. The seconds waited."""
    return runtime.wait_for_background_compiles()


def _fill(
    report: Profile,
    records: _Records,
    watched: list[Wait],
    torch_trace: TorchTrace,
    stem: Path,
    top: int,
    wall_s: float,
    error: BaseException | None,
    counters_before: dict[str, float],
) -> None:
    from tpunb.session import counter_changes, get_session

    runtime = get_session().runtime
    groups: list[FusionGroup] = records.of(FusionGroup)
    compiles = _background_compiles(groups, records.of(CompileDone))
    compiled_runs: list[CompiledCell] = records.of(CompiledCell)
    waits = wait_rows([*watched, *engine_waits(groups)])
    counters = counter_changes(counters_before, runtime.counters())
    origin = torch_trace.started_wall
    spans = [*_group_spans(groups, compiles, compiled_runs, origin), *_wait_spans(watched, origin)]
    spans += _wait_spans(engine_waits(groups), origin)
    spans += torch_trace.device_spans()
    report.wall_s, report.counters, report.spans, report.waits = wall_s, counters, spans, waits
    report.error = type(error).__name__ if error is not None else None
    report.top_ops = torch_trace.top_ops(top)
    report.groups = _with_compile_times([g.as_dict() for g in groups], compiles)
    report.groups += [_compiled_row(run) for run in compiled_runs]
    seen = Observed(
        wall_s=wall_s,
        groups=groups,
        compiles=compiles,
        compiled_runs=compiled_runs,
        waits=waits,
        counters=counters,
        memory=runtime.memory(),
        op_seconds=torch_trace.op_seconds(),
        compile_wait_s=report.time_split.get(COMPILE_WAIT, 0.0),
    )
    report.findings = [finding.as_dict() for finding in findings(seen)]
    report.time_split = time_split(
        wall_s, groups, compiles, compiled_runs, report.time_split.get(COMPILE_WAIT, 0.0)
    )
    path = stem.with_suffix(".json")
    report.trace_path = str(torch_trace.export(path, [s for s in spans if s.lane != "device"]))
    report.done = True


#: The parts of a block's time, in the order a report lists them.
RECORDING, RUNNING, COMPILED_RUNS, COMPILE_WAIT, OTHER = (
    "recording ops (fused)",
    "running groups",
    "compile-mode runs",
    "waiting for background compiles",
    "the rest (Python, eager ops, host waits outside groups)",
)
#: Beside the split, not in it: the worker's compile time, overlapped with the block.
BACKGROUND = "compiling on the worker (overlapped)"


def time_split(
    wall_s: float,
    groups: list[FusionGroup],
    compiles: list[CompileDone],
    runs: list[CompiledCell],
    compile_wait_s: float,
) -> dict[str, float]:
    """Where the block's seconds went, on the notebook's thread: parts that do not overlap,
    the rest whatever they leave, so they add up to the block's time; and, beside them, what
    the compile worker spent meanwhile."""
    waited_in_runs = sum(r.waited_ms for r in runs) / 1000
    parts = {
        RECORDING: sum(g.capture_ms for g in groups) / 1000,
        RUNNING: sum(g.run_ms for g in groups) / 1000,
        COMPILED_RUNS: sum(r.wall_ms for r in runs) / 1000 - waited_in_runs,
        COMPILE_WAIT: compile_wait_s + waited_in_runs,
    }
    parts[OTHER] = max(0.0, wall_s - sum(parts.values()))
    parts[BACKGROUND] = sum(done.compile_ms for done in compiles) / 1000
    return {part: seconds for part, seconds in parts.items() if seconds > 0}


def _group_spans(
    groups: list[FusionGroup], compiles: list[CompileDone], runs: list[CompiledCell], origin: float
) -> list[Span]:
    spans = []
    for g in groups:
        ran = g.time - origin - g.run_ms / 1000
        spans.append(
            Span("tpunb", f"run {g.key}", ran, g.run_ms / 1000, f"{g.ops} ops, {g.status}: {g.trigger}")
        )
        if g.capture_ms:
            spans.append(
                Span("tpunb", f"capture {g.key}", ran - g.capture_ms / 1000, g.capture_ms / 1000, g.source)
            )
    for done in compiles:
        seconds = done.compile_ms / 1000
        spans.append(
            Span("tpunb", f"compile {done.key}", done.time - origin - seconds, seconds, "background compile")
        )
    for run in runs:
        seconds = run.wall_ms / 1000
        spans.append(
            Span(
                "tpunb",
                f"run compiled {run.key}",
                run.time - origin - seconds,
                seconds,
                f"{run.graphs} new graph(s)",
            )
        )
    return spans


def _wait_spans(waits: list[Wait], origin: float) -> list[Span]:
    return [Span("host", f"wait {w.what}", w.ended - origin - w.seconds, w.seconds, w.at) for w in waits]


def _background_compiles(groups: list[FusionGroup], compiles: list[CompileDone]) -> list[CompileDone]:
    """The compiles no group waited for: one a flush waited for (``sync_compile``) is in that
    group's ``compile_ms`` and run time, and counting it again would double it."""
    waited_for = {g.key for g in groups if g.compile_ms is not None}
    return [done for done in compiles if done.key not in waited_for]


def _with_compile_times(rows: list[dict], compiles: list[CompileDone]) -> list[dict]:
    """Each background compile's time on the row of the group that started it (the first of
    its key not yet a hit): a group record is published before its compile ends."""
    for done in compiles:
        row = next(
            (
                r
                for r in rows
                if r["key"] == done.key and r["status"] != GroupStatus.HIT and r["compile_ms"] is None
            ),
            None,
        )
        if row is not None:
            row["compile_ms"] = done.compile_ms
    return rows


def _compiled_row(run: CompiledCell) -> dict:
    """A compile-mode run as a row of the groups table."""
    return {
        "key": run.key,
        "ops": "",
        "status": f"compiled {run.graphs} graph(s)" if run.graphs else "hit",
        "capture_ms": None,
        "compile_ms": None,
        "run_ms": run.wall_ms,
        "trigger": "compile-mode run"
        + (f"; recompiled: {'; '.join(run.recompile_reasons[:2])}" if run.recompile_reasons else ""),
    }
