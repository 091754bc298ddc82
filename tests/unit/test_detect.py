"""Runtime detection: the order, the override, the fallbacks, the hardware scan."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tpunb.runtimes import (
    ADAPTERS,
    PACKAGES,
    RuntimeUnavailable,
    create_runtime,
    detect_runtime,
    resolve_choice,
)
from tpunb.runtimes.detect import RuntimeChoice, chips_found, installed
from tpunb.runtimes.hardware import PciChip, TpuHardware, device_files, holders, scan_pci

NO_TPU = TpuHardware()
TPU = TpuHardware(chips=4, generation="v6e", device_files=("/dev/vfio/0",))


def test_override_wins_and_is_validated():
    assert detect_runtime({"TPUNB_RUNTIME": "Native"}, NO_TPU) == RuntimeChoice(
        "native", "TPUNB_RUNTIME=native", explicit=True
    )
    with pytest.raises(RuntimeUnavailable, match="'gpu' is not a runtime; accepted: native, xla, torchtpu"):
        detect_runtime({"TPUNB_RUNTIME": "gpu"}, NO_TPU)


def test_cpu_machine_picks_native_and_says_why():
    choice = detect_runtime({}, NO_TPU)
    assert choice.name == "native" and "CPU" in choice.reason


@pytest.mark.skipif(installed("torch_xla") or installed("torch_tpu"), reason="needs no TPU packages")
def test_tpu_without_tpu_packages_stays_native_and_says_so():
    choice = detect_runtime({}, TPU)
    assert choice.name == "native"
    assert "neither torch_tpu nor torch_xla" in choice.reason


@pytest.mark.skipif(installed("torch_xla"), reason="needs torch_xla absent")
def test_a_runtime_asked_for_without_its_package_says_what_to_install():
    with pytest.raises(RuntimeUnavailable, match=r"torch_xla is not installed: pip install 'tpunb\[xla\]'"):
        resolve_choice(RuntimeChoice("xla", "TPUNB_RUNTIME=xla", explicit=True))


def test_a_detected_runtime_that_fails_to_start_falls_back_to_native_with_a_warning(monkeypatch):
    # a TPU runtime whose import fails the way a torch/torch_xla mismatch does
    monkeypatch.setitem(ADAPTERS, "xla", "tpunb.runtimes.no_such_adapter:XlaRuntime")
    monkeypatch.setitem(PACKAGES, "xla", ("torch", "xla"))
    with pytest.warns(RuntimeWarning, match="the xla runtime failed to start"):
        runtime, choice = create_runtime(RuntimeChoice("xla", "a TPU found"))
    assert runtime.name == "native" and choice.name == "native"
    assert choice.reason.startswith("a TPU found, but the xla runtime failed to start")
    with pytest.raises(RuntimeUnavailable, match="failed to start"):
        create_runtime(RuntimeChoice("xla", "TPUNB_RUNTIME=xla", explicit=True))


def test_create_runtime_builds_native():
    runtime, choice = create_runtime(RuntimeChoice("native", "test"))
    assert runtime.name == "native" and runtime.device == "cpu" and choice.reason == "test"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def pci_device(sysfs, address, vendor, device, iommu_group=None):
    write(sysfs / address / "vendor", vendor)
    write(sysfs / address / "device", device)
    if iommu_group is not None:
        (sysfs / address / "iommu_group").symlink_to(sysfs.parent / "iommu_groups" / iommu_group)


def test_pci_scan_reads_google_tpu_devices(tmp_path):
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    pci_device(sysfs, "0000:00:04.0", "0x1ae0", "0x006f", iommu_group="3")
    pci_device(sysfs, "0000:00:05.0", "0x1ae0", "0x0063", iommu_group="4")
    pci_device(sysfs, "0000:00:06.0", "0x1ae0", "0x0001")  # a Google device that is not a TPU
    pci_device(sysfs, "0000:00:07.0", "0x10de", "0x2330")  # NVIDIA
    write(dev / "vfio" / "3", "")
    assert scan_pci(str(sysfs), str(dev)) == [PciChip("v6e", usable=True), PciChip("v5e", usable=False)]


def test_a_host_with_accel_files_can_use_every_chip_on_its_bus(tmp_path):
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    pci_device(sysfs, "0000:00:04.0", "0x1ae0", "0x005e")
    pci_device(sysfs, "0000:00:05.0", "0x1ae0", "0x005e")
    write(dev / "accel0", "")
    assert scan_pci(str(sysfs), str(dev)) == [PciChip("v4", usable=True)] * 2


def test_device_files_list_accel_and_numbered_vfio(tmp_path):
    for name in ("accel0", "accel1", "vfio/0", "vfio/vfio", "null"):
        write(tmp_path / name, "")
    found = [os.path.relpath(p, tmp_path) for p in device_files(str(tmp_path))]
    assert found == ["accel0", "accel1", "vfio/0"]


def test_holders_finds_another_process_with_the_file_open(tmp_path):
    device = tmp_path / "accel0"
    device.write_text("")
    code = f"f = open({str(device)!r}); import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert holders([str(device)]) == [child.pid]
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    deadline = time.time() + 5
    while holders([str(device)]) and time.time() < deadline:
        time.sleep(0.05)
    assert holders([str(device)]) == []


def test_chips_are_counted_as_this_machine_can_use_them():
    one_of_four = TpuHardware(chips=1, generation="v5e", device_files=("/dev/vfio/3",), on_bus=4)
    assert chips_found(one_of_four) == "1 TPU chip found (the PCI bus shows 4)"
    assert chips_found(TpuHardware(chips=4, generation="v4", on_bus=4)) == "4 TPU chips found"
