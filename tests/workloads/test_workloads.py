"""Others' training loops (benchmarks/workloads), in real kernels: every mode logs strict's
losses at every step, within the suite's tolerance, and draws strict's random stream.

This is the correctness half of ``python -m benchmarks.workloads`` (which also times them).
A workload whose package is not installed fails here, not skips: ``make test`` installs them
all (pyproject's ``workloads`` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks.workloads.catalog import WORKLOADS, missing_packages
from benchmarks.workloads.harness import MODES, disagreements, run_workload

sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))

from tpunb_kernels import start_kernel

#: bf16 runs in the modes whose autocast paths differ (compile mode's runs take tens of
#: seconds per workload here: fp32 covers it).
BF16_MODES = ("strict", "fused", "debug")


def test_the_suite_has_the_workloads_the_issue_asks_for():
    assert len(WORKLOADS) >= 8
    assert sum(w.draws_between_steps for w in WORKLOADS.values()) >= 3
    assert sum(w.dropout for w in WORKLOADS.values()) >= 2


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_mode_logs_strict_losses_and_draws_strict_stream(name: str, tmp_path: Path) -> None:
    workload = WORKLOADS[name]
    assert not missing_packages(workload), f"install the workloads extra: {missing_packages(workload)}"
    kernel = start_kernel(tmp_path)
    try:
        assert kernel.run("%load_ext tpunb", timeout=300).error is None
        runs = run_workload(kernel, workload, MODES, ["fp32"])
        runs += run_workload(kernel, workload, BF16_MODES, ["bf16"])
    finally:
        kernel.shutdown()
    failed = disagreements(runs, workload.steps)
    assert not failed, "\n".join(failed)
