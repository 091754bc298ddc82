"""``%%tpu_distributed`` in a real kernel: gloo workers on this machine, started by
torch.distributed's elastic launcher; DDP and FSDP2 match a single process; failures and
interrupts leave no worker behind."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psutil
import pytest
from tpunb_kernels import Kernel

from tpunb.distributed import load_returned

SETUP = """
import torch, tpunb
import torch.nn.functional as F
import torch.distributed as dist
torch.manual_seed(0)
data, labels = torch.randn(32, 16), torch.randint(0, 4, (32,))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
initial = {k: v.clone() for k, v in model.state_dict().items()}
STEPS = 8
"""

SINGLE = """
single = []
model.load_state_dict(initial)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(STEPS):
    loss = F.cross_entropy(model(data), labels)
    opt.zero_grad(); loss.backward(); opt.step()
    single.append(loss.item())
model.load_state_dict(initial)
"""

#: Each rank trains on its half of the global batch; the mean of the two halves' losses is
#: the full batch's loss, and DDP/FSDP average the gradients, so the run equals SINGLE's.
SHARDED_LOOP = """
half = data.shape[0] // WORLD_SIZE
mine = slice(RANK * half, (RANK + 1) * half)
opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
losses = []
for step in range(STEPS):
    loss = F.cross_entropy(wrapped(data[mine]), labels[mine])
    opt.zero_grad(); loss.backward(); opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    losses.append(total.item() / WORLD_SIZE)
print(f"final loss {losses[-1]:.5f}")
"""


def kernel_children(kernel: Kernel) -> list[psutil.Process]:
    pid = kernel.value("__import__('os').getpid()")
    return psutil.Process(pid).children(recursive=True)


def no_workers_left(kernel: Kernel, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not kernel_children(kernel):
            return True
        time.sleep(0.2)
    return False


def test_ddp_on_two_gloo_workers_matches_one_process(kernel: Kernel) -> None:
    assert kernel.run(SETUP + SINGLE).error is None
    cell = (
        "%%tpu_distributed -n 2 --return losses\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "wrapped = DDP(model)\n" + SHARDED_LOOP
    )
    result = kernel.run(cell, timeout=300)
    assert result.error is None, (result.error["evalue"], result.stdout[-2000:], result.stderr[-3000:])
    first = result.stdout.splitlines()[0]
    assert first.startswith("tpunb: 2 workers, gloo backend, strict mode; sent: ")
    for name in ("data (Tensor[32, 16])", "model (Sequential)", "F (module torch.nn.functional)"):
        assert name in first
    assert "[rank 0] final loss" in result.stdout and "[rank 1] final loss" in result.stdout
    assert "returned from rank 0: losses" in result.stdout
    distributed, single = kernel.value("losses"), kernel.value("single")
    assert distributed == pytest.approx(single, rel=1e-5, abs=1e-6)
    assert single[-1] < single[0]
    assert no_workers_left(kernel)


def test_fsdp2_fully_shard_runs_and_matches_one_process(kernel: Kernel) -> None:
    assert kernel.run(SETUP + SINGLE).error is None
    cell = (
        "%%tpu_distributed -n 2 --return losses\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "for layer in model:\n"
        "    if isinstance(layer, torch.nn.Linear):\n"
        "        fully_shard(layer)\n"
        "wrapped = fully_shard(model)\n" + SHARDED_LOOP
    )
    result = kernel.run(cell, timeout=300)
    assert result.error is None, (result.error["evalue"], result.stdout[-2000:], result.stderr[-3000:])
    assert kernel.value("losses") == pytest.approx(kernel.value("single"), rel=1e-4, abs=1e-5)


def test_a_failing_rank_stops_all_and_names_the_rank_and_line(kernel: Kernel) -> None:
    assert kernel.run("import torch.distributed as dist").error is None
    cell = "%%tpu_distributed -n 2\nx = 1\nif RANK == 1:\n    x = x / 0\ndist.barrier()\n"
    result = kernel.run(cell, timeout=300)
    assert result.error is not None and result.error["ename"] == "DistributedCellError"
    assert re.match(
        r"rank 1 failed at Cell In\[\d+\], line 4: ZeroDivisionError: division by zero",
        result.error["evalue"],
    )
    assert "[rank 1]     x = x / 0" in result.stderr
    assert no_workers_left(kernel)


def test_interrupting_the_cell_leaves_no_worker(kernel: Kernel) -> None:
    cell = "%%tpu_distributed -n 2\nimport time\nprint('started', flush=True)\ntime.sleep(120)\n"
    msg_id = kernel.client.execute(cell)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for both workers to be running the cell
        message = kernel.client.get_iopub_msg(timeout=120)
        if message["msg_type"] == "stream" and message["content"]["text"].count("started") >= 1:
            break
    time.sleep(1)
    kernel.manager.interrupt_kernel()
    result = kernel.collect(msg_id, timeout=60)
    assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
    assert no_workers_left(kernel)
    assert kernel.run("print(1 + 1)").stdout.strip() == "2"  # the kernel goes on


def test_the_notebooks_mode_applies_in_the_workers_and_unpicklable_values_are_named(kernel: Kernel) -> None:
    assert kernel.run("%tpu_mode debug").error is None
    result = kernel.run("%%tpu_distributed -n 1 --return inside\ninside = tpunb.current_mode()", timeout=300)
    assert result.error is None, result.error
    assert kernel.value("inside") == "debug"
    assert kernel.run("%tpu_mode strict\nimport threading\nlock = threading.Lock()").error is None
    result = kernel.run("%%tpu_distributed -n 2\nwith lock:\n    pass")
    assert result.error is not None and result.error["ename"] == "UsageError"
    assert (
        "these variables cannot be sent to the workers:\n  lock (lock: TypeError: cannot pickle"
        in (result.error["evalue"])
    )
    bad = kernel.run("%%tpu_distributed -n 0\npass")
    assert bad.error["evalue"] == "%%tpu_distributed: -n must be at least 1, not 0"


def test_a_saved_job_runs_under_torchrun_as_it_would_across_hosts(kernel: Kernel, tmp_path) -> None:
    """The multi-host path: --save writes the job; torchrun (one host here) runs the same
    worker module; rank 0's --return values come back through load_returned."""
    assert kernel.run("import torch.distributed as dist\nbase = 10").error is None
    folder = tmp_path / "job"
    cell = f"%%tpu_distributed -n 2 --return gathered --save {folder}\nt = torch.tensor([base + RANK])\n"
    cell += "parts = [torch.zeros(1, dtype=t.dtype) for _ in range(WORLD_SIZE)]\n"
    cell += "dist.all_gather(parts, t)\ngathered = [int(p) for p in parts]\n"
    saved = kernel.run(cell)
    assert saved.error is None, saved.error
    command = saved.stdout.splitlines()[1].strip()
    assert command.endswith(f"-m tpunb.distributed.worker {folder}") and "--nproc-per-node=2" in command
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    subprocess.run([*torchrun, "-m", "tpunb.distributed.worker", str(folder)], check=True, timeout=300)
    assert load_returned(folder) == {"gathered": [10, 11]}
