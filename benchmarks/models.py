"""Strict vs fused vs torch.compile on Hugging Face models, in the manner of PyTorch's dynamo harness.

    python -m benchmarks.models [--size tiny|small|both] [--mode train|infer|both]
                                [--models bert,gpt2,...] [--device cpu|cuda] [--repeats N]
                                [--quick] [--json PATH] [--threads N] [--no-fp64]

Models come from ``benchmarks/hf_suite.py``: the harness's HF list plus current decoder LMs and
vision models, built from configs with random weights (nothing is downloaded) at two sizes:
``tiny`` (op-bound: 2 layers, hidden 64, batch 4 x seq 32) and ``small`` (compute-bound:
hidden 256, seq 128). Each model runs each task in three modes, side by side in one process:

  strict   plain eager
  fused    tpunb's engine: the model (and optimizer) adopted in the first scope, compiled groups
           (``sync_compile``), timed in steady state once a step compiles nothing new
  compile  ``torch.compile`` of the step function (Inductor)

train is ``model.train()``, forward, loss, backward, AdamW step, ``loss.item()``; infer is
``model.eval()`` and a no-grad forward. What is reported, as ``benchmarks/dynamo/common.py``
does it:

  status   pass, fail_accuracy, fail_to_run (the first line of the error) or
           eager_two_runs_differ. Accuracy: eager runs twice from the same weights and must
           match exactly; fused and compile must match eager by ``torch._dynamo.utils.same``
           (allclose at tol, else RMSE against an fp64 run at most 2-3x eager's), tol 1e-2 for
           training, 5e-3 for inference on CPU (1e-3 on CUDA). Training compares the losses of
           the first steps and the gradients, parameters and buffers after them.
  ms       median step time over repeats interleaved across the modes (strict, fused, compile,
           strict, ...); speedup = strict / mode; fused/cmp = fused / compile (lower: better)
  first s  the first call, compiles included, minus eager's first call (the harness's
           "compilation latency")
  MiB      the step's peak memory over what was resident when measuring began: on CPU the
           process's RSS high-water mark (VmHWM, reset through /proc/self/clear_refs), on
           CUDA torch.cuda.max_memory_allocated
  graphs   fused: distinct compiled graphs (engine.stats()["graphs"]); compile: graphs Dynamo
           compiled (counters["stats"]["unique_graphs"])

The summary gives each mode's pass rate and geomean speedups over the models that pass in both
modes compared, per size and task. Results also go to JSON (--json; default
test-artifacts/models-<size>-<all|quick|subset>.json), rewritten after every model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Train and infer, as the harness's --training and --inference.
TASKS = ("train", "infer")
MODES = ("strict", "fused", "compile")
#: Models of --quick: an encoder, a classic decoder, a current decoder LM, a ViT (tiny, both tasks).
QUICK_MODELS = ("bert", "gpt2", "llama", "vit")
#: Steps compared for accuracy; they are also the warm-up. AdamW's bias-correction scalars are
#: lifted into the fused graph on a later step than the first, so the first steps can compile
#: new variants: four steps get through them (then up to MAX_EXTRA_WARMUP more until one
#: compiles nothing).
ACCURACY_STEPS = 4
MAX_EXTRA_WARMUP = 4
DEFAULT_REPEATS = {"tiny": 20, "small": 6}
MEMORY_STEPS = 2
LEARNING_RATE = 1e-3
#: The harness's tolerances (huggingface.py): training 1e-2, inference 1e-3 (5e-3 on CPU).
TRAIN_TOL = 1e-2
INFER_TOL = {"cpu": 5e-3, "cuda": 1e-3}


# --- results ----------------------------------------------------------------------------------


@dataclass
class ModeResult:
    status: str = "pass"
    error: str = ""
    step_ms: float | None = None
    first_s: float | None = None  # the first call, wall time
    latency_s: float | None = None  # first call minus eager's first call
    warmup_s: float | None = None  # every call until steady, minus eager's first call and steps
    warmup_ms: list[float] = field(default_factory=list)  # those calls
    peak_mib: float | None = None  # absolute high-water mark while measuring
    step_mib: float | None = None  # high-water mark over what was resident when measuring began
    graphs: int | None = None
    times_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # engine warnings, recompiles while timed
    details: dict[str, Any] = field(default_factory=dict)  # engine stats, graph breaks


@dataclass
class Record:
    model: str
    model_cls: str
    size: str
    task: str
    device: str
    modes: dict[str, ModeResult]
    wall_s: float = 0.0


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".strip()


# --- memory -----------------------------------------------------------------------------------


def _proc_status_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def reset_peak(device: torch.device) -> float | None:
    """Start a peak-memory window; returns what is resident now (MiB)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    gc.collect()
    # glibc keeps freed memory mapped, so a step reusing it would not move the RSS: hand it back
    # first, so that the window sees the step's working set (activations, gradients, temporaries).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    return _proc_status_mib("VmRSS")


def read_peak(device: torch.device) -> float | None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    return _proc_status_mib("VmHWM")


# --- the three modes --------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """A detached copy with plain tensors (outside a fused scope a DeferredTensor's ops return
    plain tensors), ModelOutputs as dicts without Nones: what ``same`` compares."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):  # ModelOutput is an OrderedDict
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class Mode:
    """One copy of the model (and optimizer) run one way; ``call`` runs one synchronous step."""

    name = "strict"

    def __init__(self, task: str, model: torch.nn.Module, inputs: dict[str, Any], device: torch.device):
        import torch

        from benchmarks.hf_suite import loss_of

        self.task, self.model, self.inputs, self.device = task, model, inputs, device
        self.result = ModeResult()
        self.optimizer = None
        self.timing = False
        if task == "train":
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
            self.optimizer = optimizer

            def step() -> torch.Tensor:
                optimizer.zero_grad(set_to_none=True)
                loss = loss_of(model(**inputs), inputs)
                loss.backward()
                optimizer.step()
                return loss.detach()

        else:
            model.eval()

            def step() -> Any:
                with torch.no_grad():
                    return model(**inputs)

        self.step: Callable[[], Any] = step

    @property
    def alive(self) -> bool:
        return self.result.status != "fail_to_run"

    def fail(self, error: BaseException, phase: str) -> None:
        self.result.status, self.result.error = "fail_to_run", f"{phase}: {first_line(error)}"
        # the innermost frames, for whoever fixes it (the JSON only; the table has the first line)
        frames = traceback.format_exception(error)
        self.result.details["traceback"] = "".join(frames[-8:])[-4000:]

    def run_step(self) -> Any:
        out = self.step()
        if self.task == "train":
            out.item()
        return out

    def call(self) -> Any:
        """One step, finished (``loss.item()`` for training; on CUDA, synchronized)."""
        import torch

        out = self.run_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out

    def state(self) -> dict[str, Any]:
        """After training steps: what the harness's ``collect_results`` compares."""
        import torch

        grads = {
            f"{n}.grad": plain(p.grad) if p.grad is not None else torch.zeros_like(plain(p))
            for n, p in self.model.named_parameters()
        }
        params = {n: plain(p) for n, p in self.model.named_parameters()}
        buffers = {n: plain(b) for n, b in self.model.named_buffers()}
        return {"grads": grads, "params": params, "buffers": buffers}

    #: Graphs the last call compiled (fused and compile modes count them).
    _new = 0

    def steady(self) -> bool:
        """Whether the last call compiled nothing new."""
        return self._new == 0

    def _compiled(self, new: int) -> None:
        """Note what the last call compiled; a timed call that compiled is flagged."""
        self._new = new
        if self.timing and new:
            self.result.details["compiled_while_timed"] = (
                self.result.details.get("compiled_while_timed", 0) + 1
            )

    def start_timing(self) -> None:
        """From here on calls are timed: count any that still compile."""
        self.timing = True

    def finish(self) -> None:
        """Fill in graph counts and stats once the mode is done."""


class FusedMode(Mode):
    name = "fused"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        from tpunb.fuse import FuseOptions, FusionEngine

        # fresh per model: its cache holds this model's groups only. While warming up, its
        # records say what flushed each group (a step flushed twice runs two graphs).
        self.engine = FusionEngine(self.device, publish=self._record)
        self.options = FuseOptions(sync_compile=True)
        self.adopt: tuple[Any, ...] = (
            (self.model,) if self.optimizer is None else (self.model, self.optimizer)
        )
        self.groups: list[Any] = []

    def _record(self, event: Any) -> None:
        if hasattr(event, "trigger"):  # a FusionGroup (CompileDone records have none)
            self.groups.append(event)

    def _stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def start_timing(self) -> None:
        # Records cost a histogram of each group's ops: time the engine as a script runs it
        # without the monitor (benchmarks/modes.py builds its engine without one too).
        self.engine.publish = None
        super().start_timing()

    def _scope_step(self) -> Any:
        with self.engine.scope(self.options, adopt=self.adopt):
            out = self.run_step()  # loss.item() flushes inside the scope; its end flushes the rest
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        self.adopt = ()  # adopted once; later scopes find the tensors deferred-capable already
        return out

    def _compiles(self) -> int:
        """Graphs compiled or failed so far: read around every timed step, so a few counters,
        not the engine's whole stats (which sum its cache's variants: 15 us a step)."""
        counters = self.engine.cache.counters
        return counters.misses + counters.compiles + counters.failures

    def call(self) -> Any:
        before = self._compiles()
        if self.timing:
            out = self._scope_step()
        else:
            self.groups = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = self._scope_step()
            for warning in caught:
                text = str(warning.message)
                if text.startswith("tpunb") and text not in self.result.notes:
                    self.result.notes.append(text)
            self.result.details["groups_per_step"] = len(self.groups)
            self.result.details["flushes"] = [f"{g.trigger} ({g.ops} ops, {g.status})" for g in self.groups]
        self._compiled(self._compiles() - before)
        return out

    def finish(self) -> None:
        self.engine.cache.wait_idle()
        stats = self._stats()
        self.result.graphs = stats["graphs"]
        self.result.details["engine"] = stats


class CompileMode(Mode):
    name = "compile"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import torch

        self.compiled = torch.compile(self.step, backend="inductor")
        self.graphs = 0

    def run_step(self) -> Any:
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        out = self.compiled()
        if self.task == "train":
            out.item()
        self._compiled(counters["stats"]["unique_graphs"] - before)
        self.graphs += self._new
        return out

    def finish(self) -> None:
        from torch._dynamo.utils import counters

        self.result.graphs = self.graphs
        self.result.details["graph_breaks"] = sum(counters["graph_break"].values())


# --- accuracy ---------------------------------------------------------------------------------


def compare(ref: Any, res: Any, fp64: Any, tol: float) -> tuple[bool, str]:
    """``torch._dynamo.utils.same`` as the harness calls it; also the first reason it logged."""
    from torch._dynamo.utils import same

    messages: list[str] = []

    def log_error(message: str, *args: Any) -> None:
        messages.append(message % args if args else message)

    ok = same(ref, res, fp64_ref=fp64, tol=tol, equal_nan=True, log_error=log_error)
    return ok, "; ".join(messages[:3])


# --- one model, one task ----------------------------------------------------------------------


def _fp64_results(task: str, pristine: torch.nn.Module, inputs: dict[str, Any], device: torch.device) -> Any:
    """The harness's fp64 reference: the same steps in float64 (None where the model can't)."""
    import torch

    try:
        model = copy.deepcopy(pristine).to(torch.float64)
        inputs64 = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in inputs.items()}
        mode = Mode(task, model, inputs64, device)
        steps = [plain(mode.call()) for _ in range(ACCURACY_STEPS)]
        return {"steps": steps, **(mode.state() if task == "train" else {})}
    except Exception:
        return None


def run_task(
    name: str,
    size: str,
    task: str,
    device: torch.device,
    repeats: int,
    use_fp64: bool,
    modes: tuple[str, ...] = MODES,
) -> Record:
    import torch

    from benchmarks.hf_suite import MODELS, build

    started = time.perf_counter()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    results = {mode: ModeResult() for mode in modes}
    record = Record(name, MODELS[name].model_cls, size, task, device.type, results)
    try:
        pristine, inputs = build(name, size, device)
    except Exception as error:
        for result in results.values():
            result.status, result.error = "fail_to_run", f"build: {first_line(error)}"
        return record
    kinds = {"strict": Mode, "fused": FusedMode, "compile": CompileMode}
    runners: dict[str, Mode] = {}
    for mode in modes:
        try:
            runners[mode] = kinds[mode](task, copy.deepcopy(pristine), inputs, device)
        except Exception as error:
            results[mode].status, results[mode].error = "fail_to_run", f"setup: {first_line(error)}"
        else:
            runners[mode].result = results[mode]

    # Accuracy, which is also the warm-up: every mode takes the same first steps.
    outputs: dict[str, Any] = {}
    for mode, runner in runners.items():
        steps = []
        for index in range(ACCURACY_STEPS):
            try:
                began = time.perf_counter()
                out = runner.call()
                runner.result.warmup_ms.append((time.perf_counter() - began) * 1000)
                steps.append(plain(out))
                if index == 0:
                    runner.result.first_s = runner.result.warmup_ms[0] / 1000
            except Exception as error:
                runner.fail(error, f"step {index + 1}")
                break
        if runner.alive:
            try:
                outputs[mode] = {"steps": steps, **(runner.state() if task == "train" else {})}
            except Exception as error:
                runner.fail(error, "reading results")
        if mode == "strict" and not runner.alive:
            break  # nothing to compare with
    strict = runners.get("strict")
    if strict is None or not strict.alive:
        for mode, result in results.items():
            if mode != "strict" and result.status == "pass":
                result.status, result.error = "fail_to_run", "strict failed: nothing to compare with"
        return _finish(record, runners, started)

    tol = TRAIN_TOL if task == "train" else INFER_TOL.get(device.type, 1e-3)
    try:
        rerun = Mode(task, copy.deepcopy(pristine), inputs, device)
        rerun_out = {"steps": [plain(rerun.call()) for _ in range(ACCURACY_STEPS)]}
        if task == "train":
            rerun_out.update(rerun.state())
        del rerun
        same_twice, why = compare(outputs["strict"], rerun_out, None, 0.0)
    except Exception as error:
        same_twice, why = False, f"eager rerun: {first_line(error)}"
    if not same_twice:  # the harness's verdict for every mode that ran
        for result in results.values():
            if result.status == "pass":
                result.status, result.error = "eager_two_runs_differ", why
    else:
        fp64 = _fp64_results(task, pristine, inputs, device) if use_fp64 else None
        for mode in modes:
            if mode == "strict" or mode not in outputs:
                continue
            try:
                ok, why = compare(outputs["strict"], outputs[mode], fp64, tol)
            except Exception as error:  # a structural mismatch (keys, types)
                ok, why = False, first_line(error)
            if not ok:
                results[mode].status, results[mode].error = "fail_accuracy", why
    eager_first = results["strict"].first_s
    for result in results.values():
        if result.first_s is not None and eager_first is not None:
            result.latency_s = result.first_s - eager_first
    del outputs

    # Steady state: step until a call compiles nothing new, then time interleaved repeats.
    live = [r for r in runners.values() if r.alive]
    for runner in live:
        for extra in range(1 + MAX_EXTRA_WARMUP):
            try:
                began = time.perf_counter()
                runner.call()
                runner.result.warmup_ms.append((time.perf_counter() - began) * 1000)
            except Exception as error:
                runner.fail(error, "warm-up")
                break
            if runner.steady():
                break
            if extra == MAX_EXTRA_WARMUP:
                runner.result.notes.append(f"still compiling after {ACCURACY_STEPS + extra + 1} steps")
        if isinstance(runner, FusedMode) and runner.alive:
            runner.engine.cache.wait_idle()
        runner.start_timing()
    for _ in range(repeats):
        for runner in [r for r in runners.values() if r.alive]:
            try:
                began = time.perf_counter()
                runner.call()
                runner.result.times_ms.append((time.perf_counter() - began) * 1000)
            except Exception as error:
                runner.fail(error, "timed step")
    for runner in runners.values():
        if runner.alive and runner.result.times_ms:
            runner.result.step_ms = statistics.median(runner.result.times_ms)
    eager = results["strict"]
    for runner in runners.values():
        # The whole warm-up's cost over eager's: fused compiles new variants on later steps too.
        calls = runner.result.warmup_ms
        if runner.alive and calls and eager.step_ms is not None and eager.first_s is not None:
            eager_ms = eager.first_s * 1000 + (len(calls) - 1) * eager.step_ms
            runner.result.warmup_s = round((sum(calls) - eager_ms) / 1000, 2)
        if runner.alive:
            try:
                resident = reset_peak(device)
                for _ in range(MEMORY_STEPS):
                    runner.call()
                peak = read_peak(device)
                if peak is not None:
                    runner.result.peak_mib = round(peak, 1)
                    if resident is not None:
                        runner.result.step_mib = round(peak - resident, 1)
            except Exception as error:
                runner.fail(error, "memory step")
    return _finish(record, runners, started)


def _finish(record: Record, runners: dict[str, Mode], started: float) -> Record:
    import torch

    for runner in runners.values():
        with contextlib.suppress(Exception):
            runner.finish()
        if runner.result.status == "fail_to_run":
            runner.result.step_ms = None
    runners.clear()
    torch._dynamo.reset()
    gc.collect()
    record.wall_s = round(time.perf_counter() - started, 1)
    return record


# --- report -----------------------------------------------------------------------------------

COLUMNS = [
    ("size", 5),
    ("model", 16),
    ("task", 5),
    ("strict ms", 9),
    ("fused ms", 9),
    ("cmp ms", 9),
    ("fused x", 7),
    ("cmp x", 7),
    ("f/cmp", 6),
    ("1st f s", 7),
    ("1st c s", 7),
    ("warm f s", 8),
    ("+MiB s/f/c", 17),
    ("graphs f/c", 10),
    ("wall s", 6),
    ("status s/f/c", 12),
]

STATUS_SHORT = {"pass": "pass", "fail_accuracy": "ACC", "fail_to_run": "RUN", "eager_two_runs_differ": "DIFF"}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def _ratio(a: float | None, b: float | None, suffix: str = "x") -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}{suffix}"


def header() -> str:
    return "  ".join(name.rjust(width) for name, width in COLUMNS)


def row(record: Record) -> str:
    m = record.modes
    s, f, c = (m.get(k, ModeResult(status="-")) for k in MODES)

    def num(v: float | None, digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    cells = [
        record.size,
        record.model,
        record.task,
        _ms(s.step_ms),
        _ms(f.step_ms),
        _ms(c.step_ms),
        _ratio(s.step_ms, f.step_ms),
        _ratio(s.step_ms, c.step_ms),
        _ratio(f.step_ms, c.step_ms, ""),
        num(f.latency_s),
        num(c.latency_s),
        num(f.warmup_s),
        "/".join(num(r.step_mib, 0) for r in (s, f, c)),
        f"{'-' if f.graphs is None else f.graphs}/{'-' if c.graphs is None else c.graphs}",
        num(record.wall_s, 0),
        "/".join(STATUS_SHORT.get(r.status, r.status) for r in (s, f, c)),
    ]
    lines = ["  ".join(cell.rjust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True))]
    for mode in MODES:
        result = m.get(mode)
        if result is None:
            continue
        if result.status != "pass":
            lines.append(f"      {mode} {result.status}: {result.error[:300]}")
        for note in result.notes:
            lines.append(f"      {mode} note: {note[:300]}")
        if result.details.get("groups_per_step", 1) > 1:
            flushes = "; ".join(result.details["flushes"])
            lines.append(
                f"      {mode} note: {result.details['groups_per_step']} groups a step: {flushes[:400]}"
            )
        if result.details.get("compiled_while_timed"):
            lines.append(
                f"      {mode} note: compiled during {result.details['compiled_while_timed']} timed steps"
            )
    return "\n".join(lines)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(records: list[Record]) -> dict[str, Any]:
    """Pass rates and geomean speedups per (size, task), over models passing in both modes compared."""
    summary: dict[str, Any] = {}
    for size in sorted({r.size for r in records}):
        for task in TASKS:
            group = [r for r in records if r.size == size and r.task == task]
            if not group:
                continue
            entry: dict[str, Any] = {"models": len(group), "pass": {}}
            for mode in MODES:
                entry["pass"][mode] = sum(
                    1 for r in group if mode in r.modes and r.modes[mode].status == "pass"
                )

            def ratios(num: str, den: str, group: list[Record] = group) -> list[float]:
                out = []
                for r in group:
                    a, b = r.modes.get(num), r.modes.get(den)
                    if a and b and a.status == b.status == "pass" and a.step_ms and b.step_ms:
                        out.append(a.step_ms / b.step_ms)
                return out

            for key, (num, den) in {
                "fused_speedup": ("strict", "fused"),  # strict time / fused time
                "compile_speedup": ("strict", "compile"),
                "fused_over_compile": ("fused", "compile"),  # fused time / compile time
            }.items():
                values = ratios(num, den)
                entry[key] = {"geomean": geomean(values), "n": len(values)}
            for mode in ("fused", "compile"):
                latencies = [
                    r.modes[mode].latency_s for r in group if mode in r.modes and r.modes[mode].latency_s
                ]
                entry[f"{mode}_latency_median_s"] = statistics.median(latencies) if latencies else None
            summary[f"{size}/{task}"] = entry
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print("\nsummary (geomeans over models passing in both modes compared)")
    for key, entry in summary.items():
        n = entry["models"]
        rates = ", ".join(f"{mode} {entry['pass'][mode]}/{n}" for mode in MODES)
        print(f"  {key}: pass {rates}")

        def g(name: str, suffix: str, entry: dict[str, Any] = entry) -> str:
            value = entry[name]["geomean"]
            return f"{'-' if value is None else f'{value:.2f}{suffix}'} (n={entry[name]['n']})"

        print(
            f"    speedup vs strict: fused {g('fused_speedup', 'x')}, compile {g('compile_speedup', 'x')};"
            f" fused/compile time {g('fused_over_compile', '')}"
        )
        lat = [
            f"{mode} {entry[f'{mode}_latency_median_s']:.1f} s"
            for mode in ("fused", "compile")
            if entry[f"{mode}_latency_median_s"] is not None
        ]
        if lat:
            print(f"    median first-call latency over eager: {', '.join(lat)}")


def write_json(path: Path, meta: dict[str, Any], records: list[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "summary": summarize(records), "results": [asdict(r) for r in records]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


# --- CLI --------------------------------------------------------------------------------------


def pick_models(spec: str | None, quick: bool) -> list[str]:
    from benchmarks.hf_suite import MODELS

    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in names if n not in MODELS]
        if unknown:
            raise SystemExit(f"unknown models {unknown}; known: {', '.join(MODELS)}")
        return names
    return list(QUICK_MODELS) if quick else list(MODELS)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """HF's one-time notices (loss_type, config checks) would interleave with the table."""
    try:
        from transformers.utils import logging as hf_logging

        previous = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
    except Exception:
        yield
        return
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=["tiny", "small", "both"], default=None, help="default tiny")
    parser.add_argument("--mode", choices=["train", "infer", "both"], default="both", help="task(s) to run")
    parser.add_argument("--models", help="comma-separated names from benchmarks/hf_suite.py (default: all)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, help="timed steps per mode (default 20 tiny, 6 small)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"only {', '.join(QUICK_MODELS)} (tiny, both tasks: 5-7 min at 1 thread on 2 cores)",
    )
    parser.add_argument("--json", type=Path, help="where to write results (default under test-artifacts/)")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP/torch threads (default 1)")
    parser.add_argument("--fp64", action=argparse.BooleanOptionalAction, default=True, help="fp64 reference")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    size_arg = args.size or "tiny"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tpunb-bench-inductor-"))
    import torch

    from benchmarks.hf_suite import MODELS

    if args.list:
        for name, spec in MODELS.items():
            print(f"{name:18s} {spec.model_cls:42s} {spec.kind:8s} {spec.harness}")
        return
    torch.set_num_threads(args.threads)
    # Dynamo's warnings (graph breaks on the profiler's record_function) would split the table;
    # failures still surface as exceptions, graph counts and graph breaks go to the results.
    torch._logging.set_logs(dynamo=logging.ERROR)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    names = pick_models(args.models, args.quick)
    sizes = ["tiny", "small"] if size_arg == "both" else [size_arg]
    tasks = list(TASKS) if args.mode == "both" else [args.mode]
    which = "quick" if args.quick and not args.models else "subset" if args.models else "all"
    json_path = args.json or Path("test-artifacts") / f"models-{size_arg}-{which}.json"
    import transformers

    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "threads": args.threads,
        "inductor_cache": os.environ["TORCHINDUCTOR_CACHE_DIR"],
        "accuracy_steps": ACCURACY_STEPS,
        "lr": LEARNING_RATE,
    }
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {device.type}, "
        f"{args.threads} thread(s), Inductor cache {meta['inductor_cache']}"
    )
    print(f"{len(names)} models x {len(sizes)} size(s) x {len(tasks)} task(s); results -> {json_path}")
    print(header(), flush=True)
    records: list[Record] = []
    began = time.perf_counter()
    with quiet_transformers(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers")
        for size in sizes:
            repeats = args.repeats or DEFAULT_REPEATS[size]
            for name in names:
                for task in tasks:
                    record = run_task(name, size, task, device, repeats, args.fp64)
                    records.append(record)
                    print(row(record), flush=True)
                    meta["wall_s"] = round(time.perf_counter() - began, 1)
                    write_json(json_path, meta, records)
    summary = summarize(records)
    print_summary(summary)
    print(f"\nwall time {time.perf_counter() - began:.0f} s; results in {json_path}")
    print(
        "speedup = strict / mode time; f/cmp = fused / compile time (lower: better); "
        "1st = first call minus eager's; warm = all calls until steady minus eager's; "
        "+MiB = peak over resident while stepping; "
        "status: pass, ACC fail_accuracy, RUN fail_to_run, DIFF eager_two_runs_differ"
    )


if __name__ == "__main__":
    main()
