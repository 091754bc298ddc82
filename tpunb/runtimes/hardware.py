"""Looking for TPU hardware without touching any runtime.

Detection must be cheap and side-effect free: initialising a TPU runtime takes seconds and
locks the chip to this process. So we read sysfs and /dev like TorchTPU's own PCI scan does
(Google's vendor id, VFIO-exposed device ids) and never import a TPU package here.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

GOOGLE_PCI_VENDOR = "0x1ae0"

#: PCI device id -> TPU generation (as TorchTPU's hardware scan knows them).
TPU_PCI_DEVICES = {
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "v7",
}


@dataclass(frozen=True)
class TpuHardware:
    """What the host exposes: the TPU chips this process can open, the device files that drive
    them, and the chips on the PCI bus (a VM can see more there than it may use: a v5litepod-4
    host that hands one chip to this machine shows 4 on the bus and one VFIO group)."""

    chips: int = 0
    generation: str | None = None
    device_files: tuple[str, ...] = ()
    held_by: tuple[int, ...] = field(default=())  # other processes with a device file open
    on_bus: int = 0

    @property
    def present(self) -> bool:
        return self.chips > 0 or bool(self.device_files)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PciChip:
    """One TPU chip on the PCI bus, and whether this machine exposes it to processes."""

    generation: str
    usable: bool


def scan_pci(sysfs: str = "/sys/bus/pci/devices", dev: str = "/dev") -> list[PciChip]:
    """The TPU chips on the PCI bus. A chip is usable, as TorchTPU counts it, when its IOMMU
    group has a ``/dev/vfio`` file, or when the host drives its chips through ``/dev/accel*``
    (older TPU VMs, where every chip on the bus has one)."""
    accel = bool(glob.glob(os.path.join(dev, "accel*")))
    found = []
    for device in sorted(glob.glob(os.path.join(sysfs, "*"))):
        if _read(os.path.join(device, "vendor")).lower() != GOOGLE_PCI_VENDOR:
            continue
        generation = TPU_PCI_DEVICES.get(_read(os.path.join(device, "device")).lower())
        if generation:
            found.append(PciChip(generation, accel or _vfio_group_exposed(device, dev)))
    return found


def _vfio_group_exposed(device: str, dev: str) -> bool:
    try:
        group = os.path.basename(os.readlink(os.path.join(device, "iommu_group")))
    except OSError:
        return False
    return os.path.exists(os.path.join(dev, "vfio", group))


def device_files(dev: str = "/dev") -> list[str]:
    """TPU device files: /dev/accel* (TPU VMs) and numbered /dev/vfio groups (newer chips)."""
    accel = glob.glob(os.path.join(dev, "accel*"))
    vfio = [p for p in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(p).isdigit()]
    return sorted(accel + vfio)


def holders(paths: list[str], proc: str = "/proc") -> list[int]:
    """PIDs (other than ours) that hold any of ``paths`` open: a TPU is one process's at a time."""
    if not paths:
        return []
    wanted = set(paths)
    own = os.getpid()
    pids = []
    for entry in glob.glob(os.path.join(proc, "[0-9]*")):
        pid = int(os.path.basename(entry))
        if pid == own:
            continue
        try:
            fds = os.listdir(os.path.join(entry, "fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(entry, "fd", fd))
            except OSError:
                continue
            if target in wanted:
                pids.append(pid)
                break
    return sorted(pids)


def scan_tpu(check_holders: bool = False) -> TpuHardware:
    """The TPU picture of this host; ``check_holders`` also scans /proc (slower)."""
    chips = scan_pci()
    files = device_files()
    generation = chips[0].generation if chips else None
    if generation is None and files:
        generation = _generation_from_env()
    held = tuple(holders(files)) if check_holders else ()
    usable = sum(chip.usable for chip in chips)
    return TpuHardware(usable, generation, tuple(files), held, on_bus=len(chips))


def _generation_from_env() -> str | None:
    """Cloud TPU VMs name the slice in the environment (e.g. ``v5litepod-1``, ``v6e-4``)."""
    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("ACCELERATOR_TYPE")
    match = re.match(r"(v\d+[a-z]*)", accelerator or "")
    return match.group(1) if match else None
