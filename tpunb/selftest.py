"""``tpunb doctor --selftest``: each mode run briefly on the runtime and device a kernel uses.

The doctor reads versions and hardware; this runs real work, the same way a notebook would:
debug mode must catch a planted NaN at its line, strict must compute what the host computes,
a 3-step fused training loop must equal strict and compile once then hit, compile mode must
compile, memory must read and the compile cache must be writable. On a TPU host nobody on
the project can reach, this table (or its ``--json``) is what a user pastes into an issue, so
every row says what ran, how long it took and, when it failed, what to do.

The planted code is compiled under its own file name, so debug mode's line finder treats it
as the user's code (tpunb's own frames are skipped) and the check is the one users rely on.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tpunb.modes import Mode, ModeConfig
from tpunb.session import Session

OK, FAIL, SKIP = "ok", "fail", "skip"

#: The file name the planted code runs under.
SELFTEST_FILE = "<tpunb-selftest>"

#: A NaN planted on line 2: debug mode must stop there and name the line.
PLANTED_NAN = """\
values = torch.tensor([1.0, -1.0], device=device)
logs = torch.log(values)
"""
PLANTED_NAN_LINE = 2

#: The fused check's loop: what a fine-tuning cell does, in three steps.
TRAINING_LOOP = """\
losses = []
for _ in range(5):  # the model's calls are compiled whole from the 4th (fuse/hot/hotcalls.py)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
"""


class SelfTestFailure(Exception):
    """A check ran but its result is wrong; the message says what was seen."""


@dataclass(frozen=True)
class StepResult:
    name: str
    status: str  # ok | fail | skip
    seconds: float
    detail: str
    fix: str = ""


@dataclass
class SelfTest:
    runtime: str
    device: str
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(step.status != FAIL for step in self.steps)

    @property
    def seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runtime": self.runtime,
            "device": self.device,
            "seconds": round(self.seconds, 3),
            "steps": [asdict(step) for step in self.steps],
        }


@dataclass(frozen=True)
class _Check:
    name: str
    run: Callable[[Session], str]  # returns the detail; raises SelfTestFailure or any error
    fix: str  # what to do when it fails
    mode: Mode | None = None  # skipped where the runtime does not run this mode


def run_selftest(session: Session) -> SelfTest:
    """Run every check in ``session`` (the kernel's, or a script's), whatever mode is set."""
    result = SelfTest(runtime=session.runtime.name, device=str(session.runtime.device))
    for check in CHECKS:
        result.steps.append(_run(check, session))
    return result


def _run(check: _Check, session: Session) -> StepResult:
    if check.mode is not None and check.mode not in session.runtime.modes:
        return StepResult(check.name, SKIP, 0.0, f"{check.mode.value} mode is not available on this runtime")
    started = time.perf_counter()
    try:
        detail, status, fix = check.run(session), OK, ""
    except SelfTestFailure as failure:
        detail, status, fix = str(failure), FAIL, check.fix
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        first_line = (str(error).splitlines() or [""])[0]
        detail = f"{type(error).__name__}: {first_line} ({Path(where.filename).name}:{where.lineno})"
        status, fix = FAIL, check.fix
    return StepResult(check.name, status, time.perf_counter() - started, detail, fix)


def _run_planted(source: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(source, SELFTEST_FILE, "exec"), namespace)
    return namespace


def check_debug(session: Session) -> str:
    from tpunb.debug import DebugCheckError

    device = session.runtime.device
    with session.scoped(ModeConfig.build("debug")):
        try:
            _run_planted(PLANTED_NAN, {"torch": torch, "device": device})
        except DebugCheckError as error:
            where = error.where
            if where is None or where.filename != SELFTEST_FILE or where.lineno != PLANTED_NAN_LINE:
                raise SelfTestFailure(f"caught the NaN but placed it at {where}, not line 2") from None
            return f"caught the planted NaN ({error.op}) at its line"
    raise SelfTestFailure("a NaN from torch.log(-1) ran through debug mode unreported")


def check_strict(session: Session) -> str:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    device = session.runtime.device
    with session.scoped(ModeConfig.build("strict")):
        product = (a.to(device) @ b.to(device)).cpu()
    expected = a @ b
    if not torch.allclose(product, expected, rtol=1e-4, atol=1e-4):
        worst = (product - expected).abs().max().item()
        raise SelfTestFailure(f"a 64×64 matmul differs from the host's by up to {worst:.3g}")
    return f"a 64×64 matmul on {device} equals the host's"


def _small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _training_run(session: Session, config: ModeConfig, state: dict[str, Any]) -> list[float]:
    device = session.runtime.device
    model = _small_model()
    model.load_state_dict(state)
    namespace = {
        "torch": torch,
        "model": model.to(device),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "inputs": torch.linspace(-1, 1, 64 * 16).reshape(64, 16).to(device),
        "targets": torch.linspace(0, 1, 64).reshape(64, 1).to(device),
    }
    with session.scoped(config):
        _run_planted(TRAINING_LOOP, namespace)
    return namespace["losses"]


def check_fused(session: Session) -> str:
    state = _small_model().state_dict()
    strict = _training_run(session, ModeConfig.build("strict"), state)
    before = session.runtime.cache_stats()
    fused = _training_run(session, ModeConfig.build("fused", sync_compile=True), state)
    after = session.runtime.cache_stats()
    misses, hits = after.misses - before.misses, after.hits - before.hits
    if not torch.allclose(torch.tensor(fused), torch.tensor(strict), rtol=1e-4, atol=1e-5):
        raise SelfTestFailure(f"losses {_floats(fused)} differ from strict's {_floats(strict)}")
    if misses < 1 or hits < 1:
        raise SelfTestFailure(f"5 steps compiled {misses} and hit the cache {hits} times; expected ≥1 each")
    return f"5 training steps equal strict ({_floats(fused)}); {misses} compiled, {hits} cache hits"


def check_compile(session: Session) -> str:
    import tpunb

    device = session.runtime.device
    a, b = torch.randn(32, 32).to(device), torch.randn(32, 32).to(device)

    def gelu_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ y) + 1

    compiled_before = session.bus.count("compiled")
    with session.scoped(ModeConfig.build("strict")):
        result = tpunb.compile(gelu_matmul)(a, b).cpu()
        expected = gelu_matmul(a, b).cpu()
    records = session.bus.recent("compiled", session.bus.count("compiled") - compiled_before)
    graphs = sum(record.graphs for record in records)
    if not torch.allclose(result, expected, rtol=1e-4, atol=1e-4):
        raise SelfTestFailure("the compiled function's result differs from eager's")
    if graphs < 1:
        raise SelfTestFailure("tpunb.compile ran but reported no compiled graph")
    return f"tpunb.compile compiled {graphs} graph(s); the result equals eager's"


def check_memory(session: Session) -> str:
    memory = session.runtime.memory()
    if memory is None:
        return f"{session.runtime.device} reports no memory figures (expected on a CPU device)"
    figures = {"used": memory.used, "peak": memory.peak, "limit": memory.limit}
    known = ", ".join(f"{name} {_mib(value)}" for name, value in figures.items() if value is not None)
    return f"{memory.label}: {known or 'no figures'}"


def check_cache_dir(session: Session) -> str:
    directory = session.runtime.cache_dir()
    if directory is None:
        return "no persistent compile cache is set: compiles are redone in a new kernel (%tpu_cache DIR)"
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".tpunb-selftest-"):
        pass
    free = os.statvfs(path)
    return f"{directory} is writable ({_mib(free.f_bavail * free.f_frsize)} free)"


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.5g}" for v in values) + "]"


def _mib(value: int | None) -> str:
    return f"{value / 2**20:,.0f} MiB" if value is not None else "?"


REPORT = "run `tpunb doctor --selftest --json` and attach it to a bug report"

CHECKS = (
    _Check("debug", check_debug, f"debug mode's NaN check is not working here: {REPORT}", Mode.DEBUG),
    _Check(
        "strict",
        check_strict,
        "plain ops fail or are wrong: check the torch / runtime pair in `tpunb doctor`",
        Mode.STRICT,
    ),
    _Check(
        "fused",
        check_fused,
        f"use %tpu_mode strict or compile until this is fixed, and {REPORT}",
        Mode.FUSED,
    ),
    _Check(
        "compile",
        check_compile,
        f"torch.compile does not work here: use %tpu_mode strict or fused, and {REPORT}",
        Mode.COMPILE,
    ),
    _Check("memory", check_memory, f"the monitor cannot show memory: {REPORT}"),
    _Check(
        "cache dir",
        check_cache_dir,
        "choose a writable directory: %tpu_cache DIR, or TPUNB_CACHE_DIR before the kernel starts",
    ),
)


def format_selftest(result: SelfTest) -> str:
    """The table users read (and paste): result, time and detail per check, fixes below."""
    width = max(len(step.name) for step in result.steps)
    lines = [f"tpunb self-test on the {result.runtime} runtime, device {result.device}"]
    for step in result.steps:
        lines.append(f"{step.status:<4}  {step.name:<{width}}  {step.seconds:6.2f} s  {step.detail}")
    for step in result.steps:
        if step.fix:
            lines.append(f"  {step.name}: {step.fix}")
    verdict = "every mode works here" if result.ok else "problems found: see the 'fail' rows"
    lines.append(f"self-test: {verdict} ({result.seconds:.1f} s)")
    return "\n".join(lines)
