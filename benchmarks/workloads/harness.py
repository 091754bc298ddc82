"""Runs a workload's training cell in each mode in one real kernel and compares it with strict.

A run is two cells, as a user would write them: the workload's set-up in strict mode (seeded,
so every run starts from the same weights, data and generator state), then its training cell
under ``%%tpu_mode MODE``, with the precision chosen by ``%tpu_precision`` in a cell before.
The workload logs each step's loss through ``record(loss)``, which also stamps the time; after
the cell the harness reads the losses, the stamps, a digest of the CPU generator's state
(the random stream: equal digests mean every draw was strict's) and tpunb's summary of the cell.

Fused mode runs twice: *cold* (its groups and hot calls are new: they run as recorded while
they compile in the background) and *warm* (the same cell again, once the background compiles
have finished, as in a notebook whose user reads the output before running the cell again; a
cell run at once would still find most of them compiling on this 2-core machine). With every
training call recorded (``--no-hot-training``), the same pair again.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from benchmarks.workloads.catalog import Workload

#: The modes a workload runs in, in order; "fused" runs cold, then "fused-warm"; "fused-recorded"
#: is fused mode with every training call recorded (``--no-hot-training``), cold then warm.
#: Compile mode before fused: a compile cell first waits for fused groups still compiling in
#: the background.
MODES = ("strict", "compile", "fused", "fused-warm", "fused-recorded", "fused-recorded-warm", "debug")
#: The cell magic's arguments for each mode.
RECORDED = "fused --no-hot-training"
MAGIC = {"fused-warm": "fused", "fused-recorded": RECORDED, "fused-recorded-warm": RECORDED}
#: Before a warm run: the background compiles of the cold run finish.
WARM_UP = "_tpunb.runtime().wait_for_background_compiles()"
PRECISIONS = ("fp32", "bf16")
#: Loss tolerance against strict, per precision (relative, absolute): fp32 differs only in the
#: order of floating-point sums (compiled kernels); bf16 keeps 8 bits of mantissa, and a
#: compiled kernel may keep an intermediate in fp32 where eager rounds it.
TOLERANCE = {"fp32": (1e-3, 1e-4), "bf16": (3e-2, 1e-2)}
#: Steps whose time says nothing about the steady state: the first ones compile or warm caches.
WARMUP_STEPS = 2

#: Defined in the kernel before a workload's set-up: ``record(loss)`` and what it fills.
RECORDER = """
import hashlib as _hashlib, time as _time, torch as _torch, tpunb as _tpunb
_wl_losses, _wl_stamps = [], []
def record(loss):
    _wl_losses.append(float(loss))
    _wl_stamps.append(_time.perf_counter())
def _wl_report(started):
    state = _torch.random.get_rng_state().numpy().tobytes()
    return {"losses": _wl_losses, "stamps": [s - started for s in _wl_stamps],
            "rng": _hashlib.sha1(state).hexdigest()[:16]}
"""


class Cells(Protocol):
    """A kernel that runs cells (tests/kernel/tpunb_kernels.py's ``Kernel``)."""

    def run(self, code: str, timeout: float = ...) -> object: ...


@dataclass
class Run:
    """One training cell of one workload in one mode and precision."""

    workload: str
    mode: str
    precision: str
    losses: list[float] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)
    rng: str = ""
    summary: str = ""  # tpunb's lines under the cell (the summary, warnings it raised)
    error: str | None = None

    @property
    def first_step_s(self) -> float | None:
        return self.stamps[0] if self.stamps else None

    @property
    def cell_s(self) -> float | None:
        """From the cell's start to its last logged step: the time the user waited."""
        return self.stamps[-1] if self.stamps else None

    @property
    def ms_per_step(self) -> float | None:
        """The median step time after the warm-up steps."""
        later = self.stamps[WARMUP_STEPS:]
        steps = [b - a for a, b in itertools.pairwise(later)]
        return statistics.median(steps) * 1000 if steps else None


@dataclass
class Comparison:
    """A run against strict's run of the same workload and precision."""

    run: Run
    max_abs: float
    max_rel: float
    same_stream: bool
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(run: Run, strict: Run) -> Comparison:
    """Every step's loss within the precision's tolerance of strict's, and the same stream."""
    rel_tol, abs_tol = TOLERANCE[run.precision]
    problems = [f"{run.mode} failed: {run.error}"] if run.error else []
    if len(run.losses) != len(strict.losses):
        problems.append(f"{len(run.losses)} losses logged, strict logged {len(strict.losses)}")
    diffs = [abs(a - b) for a, b in zip(run.losses, strict.losses, strict=False)]
    rels = [d / max(abs(b), 1e-12) for d, b in zip(diffs, strict.losses, strict=False)]
    for step, (diff, expected) in enumerate(zip(diffs, strict.losses, strict=False)):
        if diff > abs_tol + rel_tol * abs(expected):
            problems.append(f"step {step}: loss {run.losses[step]:.6g}, strict {expected:.6g}")
            break
    same_stream = run.rng == strict.rng
    if not same_stream:
        problems.append("the random stream differs from strict's after the cell")
    return Comparison(run, max(diffs, default=0.0), max(rels, default=0.0), same_stream, problems)


def run_workload(
    kernel: Cells,
    workload: Workload,
    modes: Sequence[str],
    precisions: Iterable[str],
    steps: int | None = None,
    device: str = "cpu",
) -> list[Run]:
    """Each precision, then each mode (strict first), in one kernel that has tpunb loaded;
    ``device`` is the set-up's ``DEVICE``: "cpu", or "xla" in a kernel on the xla runtime."""
    _cell(kernel, RECORDER)
    runs = []
    for precision in precisions:
        for mode in ("strict", *(m for m in modes if m != "strict")):
            runs.append(_one_run(kernel, workload, mode, precision, steps or workload.steps, device))
    return runs


def _one_run(kernel: Cells, workload: Workload, mode: str, precision: str, steps: int, device: str) -> Run:
    run = Run(workload.name, mode, precision)
    _cell(kernel, "%tpu_precision fp32")
    defined = f"STEPS, DEVICE = {steps}, {device!r}"
    _cell(kernel, f"_wl_losses.clear(); _wl_stamps.clear()\n{defined}\n{workload.setup}")
    _cell(kernel, f"%tpu_precision {precision}")
    if mode.endswith("-warm"):
        _cell(kernel, WARM_UP)
    cell_mode = MAGIC.get(mode, mode)
    body = f"_wl_started = _time.perf_counter()\n{workload.train}"
    result = kernel.run(f"%%tpu_mode {cell_mode}\n{body}", timeout=1800)
    error = getattr(result, "error", None)
    if error is not None:
        run.error = f"{error.get('ename')}: {error.get('evalue', '')[:300]}"
    shown = getattr(result, "stdout", "").splitlines() + getattr(result, "stderr", "").splitlines()
    run.summary = "\n".join(line for line in shown if "tpunb" in line)
    _cell(kernel, "%tpu_precision fp32")
    report = _cell(kernel, "import json as _json; print('@wl@' + _json.dumps(_wl_report(_wl_started)))")
    line = next(x for x in report.splitlines() if x.startswith("@wl@"))
    values = json.loads(line.removeprefix("@wl@"))
    run.losses, run.stamps, run.rng = values["losses"], values["stamps"], values["rng"]
    return run


def _cell(kernel: Cells, code: str) -> str:
    result = kernel.run(code, timeout=1800)
    error = getattr(result, "error", None)
    if error is not None:
        raise RuntimeError(f"harness cell failed: {error.get('ename')}: {error.get('evalue')}\n{code}")
    return getattr(result, "stdout", "")


def comparisons(runs: Sequence[Run]) -> list[Comparison]:
    """Each non-strict run against the strict run of its workload and precision."""
    strict = {(r.workload, r.precision): r for r in runs if r.mode == "strict"}
    return [compare(r, strict[(r.workload, r.precision)]) for r in runs if r.mode != "strict"]


def disagreements(runs: Sequence[Run], steps: int) -> list[str]:
    """What every test of the suite asserts is empty: each run logged a loss per step at least
    (an evaluation's come besides), and each non-strict run agrees with strict (``compare``:
    as many losses, each within tolerance), one line per run that does not."""
    short = [f"{r.precision} {r.mode}: {len(r.losses)} losses logged" for r in runs if len(r.losses) < steps]
    return short + [
        f"{c.run.precision} {c.run.mode}: {'; '.join(c.problems)}" for c in comparisons(runs) if not c.ok
    ]
