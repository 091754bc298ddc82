"""``tpunb doctor``: what this environment has, what is broken, which runtime a kernel picks.

Each check is a small function returning Check records, so the table, the JSON and the
exit status all come from the same list. Checks read package metadata instead of
importing TPU packages (importing torch_xla or torch_tpu can grab the chip).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tpunb.reserved_calls import fixed_release
from tpunb.runtimes import RuntimeUnavailable, detect_runtime, resolve_choice
from tpunb.runtimes.detect import chips_found, cuda_device_name, installed
from tpunb.runtimes.hardware import TpuHardware, scan_tpu
from tpunb.versions import distribution_version, release, required_by, torch_xla_mismatch

OK, INFO, WARN, ERROR = "ok", "info", "warn", "error"

#: Packages whose versions the report lists: (distribution, required for tpunb to work).
PACKAGES = (
    ("tpunb", True),
    ("torch", True),
    ("torch_xla", False),
    ("torch_tpu", False),
    ("libtpu", False),
    ("jax", False),
    ("jaxlib", False),
    ("ipykernel", True),
    ("ipython", True),
    ("jupyterlab", False),
    ("ipywidgets", False),
    ("anywidget", False),
    ("transformers", False),
)

#: torch versions torch_tpu 0.2.0 supports (it fails ``import torch`` outside them).
TORCH_TPU_TORCH_RANGE = ((2, 11), (2, 15))


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | info | warn | error
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    tpu: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(check.status != ERROR for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runtime": self.runtime,
            "checks": [asdict(c) for c in self.checks],
            "versions": self.versions,
            "tpu": self.tpu,
        }


def check_versions(versions: dict[str, str | None]) -> list[Check]:
    checks = [Check("python", OK if sys.version_info >= (3, 11) else ERROR, platform.python_version())]
    for name, required in PACKAGES:
        version = versions[name]
        status = OK if version else ERROR if required else INFO
        checks.append(Check(name, status, version or "not installed"))
    ipykernel = versions.get("ipykernel")
    if ipykernel and release(ipykernel)[:2] == (7, 0):
        checks.append(Check("ipykernel 7.0", WARN, "widget updates from threads break on 7.0.x; use >=7.1"))
    return checks


def check_torch_pairs(versions: dict[str, str | None]) -> list[Check]:
    torch, xla, tpu = versions.get("torch"), versions.get("torch_xla"), versions.get("torch_tpu")
    checks = []
    if torch and xla:
        mismatch = torch_xla_mismatch(torch, xla)
        detail = mismatch or f"torch {torch}, torch_xla {xla}"
        checks.append(Check("torch = torch_xla", ERROR if mismatch else OK, detail))
    if torch and tpu:
        low, high = TORCH_TPU_TORCH_RANGE
        inside = low <= release(torch)[:2] <= high
        detail = f"torch {torch}; torch_tpu supports torch {low[0]}.{low[1]}-{high[0]}.{high[1]}"
        checks.append(Check("torch for torch_tpu", OK if inside else ERROR, detail))
    transformers = versions.get("transformers")
    wanted = fixed_release("transformers", transformers)
    if tpu and wanted:
        detail = (
            f"transformers {transformers} calls torch.tpu.is_available, which torch_tpu keeps to torch "
            f"itself: TrainingArguments (every Trainer) fails; pip install -U 'transformers>={wanted}'"
        )
        checks.append(Check("transformers for torch_tpu", WARN, detail))
    return checks


def check_libtpu(versions: dict[str, str | None], needed: str | None) -> list[Check]:
    """torch_tpu's libtpu: a machine can carry JAX's older one first on the path, and torch_tpu
    then fails inside ``import torch`` (0.2.0 needs >= 0.0.50; a TPU image's JAX brought
    0.0.42.1), or compiles nothing that uses Mosaic. ``needed`` is torch_tpu's own specifier."""
    tpu, libtpu = versions.get("torch_tpu"), versions.get("libtpu")
    if not tpu or not needed:
        return []
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    fix = f"pip install 'libtpu{needed}'"
    if libtpu is None:
        missing = f"not installed; torch_tpu {tpu} needs libtpu{needed}: {fix}"
        return [Check("libtpu for torch_tpu", ERROR, missing)]
    try:
        fits = Version(libtpu) in SpecifierSet(needed)
    except InvalidVersion:
        fits = False
    if fits:
        return [Check("libtpu for torch_tpu", OK, f"libtpu {libtpu}; torch_tpu {tpu} needs libtpu{needed}")]
    detail = f"libtpu {libtpu} comes first on the path; torch_tpu {tpu} needs libtpu{needed}: {fix}"
    return [Check("libtpu for torch_tpu", ERROR, detail)]


def check_tpu(tpu: TpuHardware, versions: dict[str, str | None]) -> list[Check]:
    if not tpu.present:
        return [Check("TPU", INFO, "no TPU chip on the PCI bus and no /dev/accel* or /dev/vfio device")]
    devices = ", ".join(tpu.device_files) or "none"
    found = f"{chips_found(tpu)}, {tpu.generation or 'unknown generation'}; devices: {devices}"
    checks = [Check("TPU", OK, found)]
    if tpu.held_by:
        pids = ", ".join(str(pid) for pid in tpu.held_by)
        checks.append(
            Check("TPU free", ERROR, f"held by process(es) {pids}: stop the other kernel or process first")
        )
    else:
        checks.append(Check("TPU free", OK, "no other process has the TPU device open"))
    if not (versions.get("torch_xla") or versions.get("torch_tpu")):
        missing = "a TPU is here but neither torch_xla nor torch_tpu is installed"
        checks.append(Check("TPU runtime", WARN, missing))
    if versions.get("jax") and versions.get("torch_xla"):
        owner = "both installed: whichever touches the TPU first owns it; import torch_xla first"
        checks.append(Check("jax + torch_xla", WARN, owner))
    return checks


def check_runtime_settings(
    versions: dict[str, str | None], env: Mapping[str, str], tpu: TpuHardware
) -> list[Check]:
    """Settings that decide what a TPU runtime shows or does; most are read once at import,
    so they must be right before the kernel starts."""
    checks = []
    if versions.get("torch_xla"):
        if not tpu.present and not env.get("PJRT_DEVICE") and not env.get("TPUNB_RUNTIME"):
            idle = "torch_xla is installed but, with no TPU, used only with PJRT_DEVICE=CPU set"
            checks.append(Check("PJRT_DEVICE", INFO, idle))
        level = env.get("PT_XLA_DEBUG_LEVEL")
        if env.get("TPUNB_XLA_GRAPH_LOG") == "0" or (level is not None and level.strip() in ("0", "1")):
            quiet = "torch_xla's graph log is off: the monitor counts graphs but cannot list them"
            checks.append(Check("XLA graph log", INFO, quiet))
        if env.get("XLA_PERSISTENT_CACHE_PATH"):
            checks.append(Check("XLA cache", OK, env["XLA_PERSISTENT_CACHE_PATH"]))
    if versions.get("torch_tpu"):
        if not env.get("TORCH_TRACE"):
            groups = "TorchTPU reports fusion groups only with TORCH_TRACE=<dir> set before the kernel starts"
            checks.append(Check("TorchTPU trace", INFO, groups))
        if env.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"):
            checks.append(Check("TorchTPU cache", OK, env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"]))
    return checks


def check_cuda() -> list[Check]:
    if not installed("torch"):
        return []
    name = cuda_device_name()
    return [Check("CUDA", OK if name else INFO, name or "no CUDA device")]


def check_runtime(report: Report, tpu: TpuHardware) -> list[Check]:
    try:
        choice = resolve_choice(detect_runtime(tpu=tpu))
    except RuntimeUnavailable as error:
        report.runtime = {"name": "", "reason": str(error)}
        return [Check("runtime", ERROR, str(error))]
    report.runtime = {"name": choice.name, "reason": choice.reason}
    return [Check("runtime", OK, f"a kernel would use {choice.name}: {choice.reason}")]


def run_checks() -> Report:
    report = Report()
    report.versions = {name: distribution_version(name) for name, _ in PACKAGES}
    tpu = scan_tpu(check_holders=True)
    report.tpu = {**asdict(tpu), "present": tpu.present}
    report.checks += check_versions(report.versions)
    report.checks += check_torch_pairs(report.versions)
    report.checks += check_libtpu(report.versions, required_by("torch_tpu", "libtpu"))
    report.checks += check_tpu(tpu, report.versions)
    report.checks += check_runtime_settings(report.versions, os.environ, tpu)
    report.checks += check_cuda()
    report.checks += check_runtime(report, tpu)
    return report


def doctor_output(selftest: bool, as_json: bool) -> tuple[str, bool]:
    """What ``tpunb doctor`` and ``%tpu_doctor`` print, and whether everything passed: the
    report, then (``selftest``) each mode run on the runtime the process's session uses."""
    report = run_checks()
    payload, texts, ok = report.as_dict(), [format_report(report)], report.ok
    if selftest and not report.runtime.get("name"):
        payload["selftest"] = {"ok": False, "not_run": report.runtime["reason"]}
        texts.append(f"self-test not run: no runtime to run it on ({report.runtime['reason']})")
        ok = False
    elif selftest:
        from tpunb.selftest import format_selftest, run_selftest
        from tpunb.session import get_session

        result = run_selftest(get_session())
        payload["selftest"] = result.as_dict()
        texts.append(format_selftest(result))
        ok = ok and result.ok
    return (json.dumps(payload, indent=2) if as_json else "\n\n".join(texts)), ok


def format_report(report: Report) -> str:
    width = max(len(c.name) for c in report.checks)
    lines = [f"{c.status:<5}  {c.name:<{width}}  {c.detail}" for c in report.checks]
    verdict = "ok" if report.ok else "problems found: see the 'error' rows"
    return "\n".join(["tpunb doctor", *lines, f"result: {verdict}"])
