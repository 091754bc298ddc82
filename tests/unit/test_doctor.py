"""``tpunb doctor``: the checks as functions, and the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tpunb.doctor import (
    ERROR,
    INFO,
    OK,
    WARN,
    check_libtpu,
    check_runtime_settings,
    check_torch_pairs,
    check_tpu,
)
from tpunb.runtimes.hardware import TpuHardware
from tpunb.versions import release

DOCUMENTED_KEYS = {"ok", "runtime", "checks", "versions", "tpu"}


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpunb", "doctor", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_release_parsing():
    assert release("2.9.0+cpu") == (2, 9, 0)
    assert release("2.13.0") == (2, 13, 0)
    assert release("2.10.0rc1") == (2, 10, 0)
    assert release("0.2.0.dev20260101") == (0, 2, 0)


def test_torch_and_torch_xla_must_match():
    same = check_torch_pairs({"torch": "2.9.0+cpu", "torch_xla": "2.9.0"})
    assert [c.status for c in same] == [OK]
    different = check_torch_pairs({"torch": "2.13.0", "torch_xla": "2.9.0"})
    assert different[0].status == ERROR and "must be the same release" in different[0].detail


def test_torch_tpu_needs_a_torch_in_its_range():
    assert check_torch_pairs({"torch": "2.13.0", "torch_tpu": "0.2.0"})[0].status == OK
    assert check_torch_pairs({"torch": "2.9.0", "torch_tpu": "0.2.0"})[0].status == ERROR


def test_a_transformers_whose_trainer_cannot_start_beside_torch_tpu_is_named_with_the_fix():
    # transformers 5.17 (a TPU image's) raised in TrainingArguments() on a v5e; 5.20 asks torch.accelerator
    old = check_torch_pairs({"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "5.17.0"})
    assert [c.status for c in old] == [OK, WARN]
    assert old[1].detail.endswith("(every Trainer) fails; pip install -U 'transformers>=5.20'")
    fixed = check_torch_pairs({"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "5.25.0"})
    assert [c.status for c in fixed] == [OK]
    assert check_torch_pairs({"torch": "2.13.0", "transformers": "5.17.0"}) == []  # no torch_tpu: no guard


def test_a_libtpu_older_than_torch_tpu_needs_is_named_with_the_fix():
    # a TPU machine whose JAX brought libtpu 0.0.42.1, first on the path
    old = check_libtpu({"torch_tpu": "0.2.0", "libtpu": "0.0.42.1"}, ">=0.0.50")
    assert [c.status for c in old] == [ERROR]
    assert old[0].detail == (
        "libtpu 0.0.42.1 comes first on the path; torch_tpu 0.2.0 needs libtpu>=0.0.50: "
        "pip install 'libtpu>=0.0.50'"
    )
    assert check_libtpu({"torch_tpu": "0.2.0", "libtpu": "0.0.51"}, ">=0.0.50")[0].status == OK
    assert "not installed" in check_libtpu({"torch_tpu": "0.2.0"}, ">=0.0.50")[0].detail
    assert check_libtpu({"libtpu": "0.0.51"}, None) == []  # no torch_tpu: nothing to check


def test_busy_tpu_is_an_error_naming_the_process():
    busy = TpuHardware(chips=1, generation="v5e", device_files=("/dev/vfio/0",), held_by=(4242,))
    checks = {c.name: c for c in check_tpu(busy, {"torch_xla": "2.9.0", "jax": "0.10"})}
    assert checks["TPU free"].status == ERROR and "4242" in checks["TPU free"].detail
    assert checks["jax + torch_xla"].status == WARN


def test_json_report_has_the_documented_keys():
    result = doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == DOCUMENTED_KEYS
    assert report["ok"] is True
    assert report["runtime"]["name"] == "native"
    assert report["versions"]["torch"] and report["versions"]["tpunb"]
    assert {"chips", "generation", "device_files", "held_by", "present"} <= set(report["tpu"])
    assert all(set(c) == {"name", "status", "detail"} for c in report["checks"])


def test_broken_setup_exits_non_zero_with_the_reason():
    result = doctor(TPUNB_RUNTIME="quantum")
    assert result.returncode == 1
    assert "error  runtime" in result.stdout and "'quantum' is not a runtime" in result.stdout


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "tpunb")
    result = subprocess.run([script, "doctor"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("tpunb doctor")


def test_runtime_settings_say_what_a_tpu_runtime_will_show():
    both = {"torch_xla": "2.9.0", "torch_tpu": "0.2.0"}
    names = {c.name: c for c in check_runtime_settings(both, {}, TpuHardware())}
    assert names["PJRT_DEVICE"].status == INFO and "PJRT_DEVICE=CPU" in names["PJRT_DEVICE"].detail
    assert "TORCH_TRACE" in names["TorchTPU trace"].detail
    quiet = check_runtime_settings(
        {"torch_xla": "2.9.0"}, {"PT_XLA_DEBUG_LEVEL": "1", "PJRT_DEVICE": "CPU"}, TpuHardware()
    )
    assert [c.name for c in quiet] == ["XLA graph log"]
    assert check_runtime_settings({}, {"PT_XLA_DEBUG_LEVEL": "1"}, TpuHardware()) == []
