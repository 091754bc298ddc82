"""``%%tpu_distributed``'s work, between parsing (magics.py) and launching (launch.py)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import cloudpickle

from tpunb.distributed.backend import auto_backend
from tpunb.distributed.files import JOB_FILE
from tpunb.distributed.job import Job, build_job
from tpunb.distributed.launch import run_job
from tpunb.session import Session
from tpunb.source import running_cell_number


def run_distributed_cell(
    shell: Any,
    session: Session,
    cell: str,
    *,
    nprocs: int,
    backend: str,
    returns: tuple[str, ...],
    save: str | None = None,
) -> None:
    """Run the cell body on ``nprocs`` workers; put what rank 0 returns in the notebook.
    With ``save``, write the job there for ``torchrun`` on several hosts instead."""
    __tracebackhide__ = True
    runtime = session.runtime
    chosen = auto_backend(runtime.name, runtime.device) if backend == "auto" else backend
    job = build_job(
        cell,
        shell.user_ns,
        first_line=2,  # the body starts on the line after %%tpu_distributed
        filename=f"Cell In[{running_cell_number(shell)}]",
        mode=session.effective.mode.value,
        backend=chosen,
        returns=returns,
    )
    sent = ", ".join(job.sent) or "nothing"
    if save is not None:
        print(save_for_torchrun(job, Path(save), nprocs))
        return
    print(f"tpunb: {nprocs} workers, {chosen} backend, {job.mode} mode; sent: {sent}", flush=True)
    returned = run_job(job, nprocs)
    shell.user_ns.update(returned)
    if returned:
        print(f"tpunb: returned from rank 0: {', '.join(returned)}")


def save_for_torchrun(job: Job, job_dir: Path, nprocs: int) -> str:
    """Write ``job`` to ``job_dir`` and say how to run it on several hosts with torchrun.

    The workers are the same module %%tpu_distributed starts locally, so the cell behaves
    the same; copy the folder to every host (or use a shared file system).
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / JOB_FILE).write_bytes(cloudpickle.dumps(job))
    folder = shlex.quote(str(job_dir))
    return (
        f"tpunb: saved the cell's job to {job_dir}. On each of N hosts (same Python environment):\n"
        f"  {Path(sys.executable).name} -m torch.distributed.run --nnodes=N --nproc-per-node={nprocs} "
        f"--rdzv-backend=c10d --rdzv-endpoint=FIRST_HOST:29500 -m tpunb.distributed.worker {folder}\n"
        f"Rank 0's --return values land in {folder}/returned.pkl (tpunb.distributed.load_returned)."
    )


def load_returned(job_dir: str | Path) -> dict[str, Any]:
    """The values rank 0 saved (``--return``) after a torchrun run of a saved job."""
    from tpunb.distributed.files import RESULT_FILE

    return cloudpickle.loads((Path(job_dir) / RESULT_FILE).read_bytes())
