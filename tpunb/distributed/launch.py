"""Running a job on N local worker processes with torch.distributed's elastic launcher.

The launcher (the machinery behind ``torchrun``) does the rendezvous, sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the store address, writes each rank's output to files and
tails them back here, where the kernel shows them in the cell as they come, each line
prefixed ``[rank k]``. When one rank fails, it stops the others; when the cell is
interrupted, it terminates every worker (SIGTERM, then SIGKILL after a few seconds).
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import cloudpickle

from tpunb.distributed.files import ERROR_FILE, JOB_FILE, LOG_DIR, RESULT_FILE
from tpunb.distributed.job import Job

#: Seconds a worker gets to exit after SIGTERM before SIGKILL.
SHUTDOWN_TIMEOUT_S = 5
#: The signals the launcher takes over while it runs; the kernel's own handlers come back after.
LAUNCHER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class DistributedCellError(RuntimeError):
    """A rank of a distributed cell failed; its traceback was shown above, prefixed by rank."""


def run_job(job: Job, nprocs: int) -> dict[str, Any]:
    """Run ``job`` on ``nprocs`` workers; the values rank 0 returned, by name."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    job_dir = Path(tempfile.mkdtemp(prefix="tpunb-distributed-"))
    (job_dir / JOB_FILE).write_bytes(cloudpickle.dumps(job))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        log_line_prefix_template="[rank ${rank}] ",
        logs_specs=DefaultLogsSpecs(log_dir=str(job_dir / LOG_DIR), redirects=Std.ALL, tee=Std.ALL),
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    handlers = {sig: signal.getsignal(sig) for sig in LAUNCHER_SIGNALS}
    elastic_log = logging.getLogger("torch.distributed.elastic")
    log_level, elastic_log.level = elastic_log.level, logging.CRITICAL  # failures are ours to report
    try:
        elastic_launch(config, sys.executable)("-m", "tpunb.distributed.worker", str(job_dir))
        result = job_dir / RESULT_FILE
        return cloudpickle.loads(result.read_bytes()) if result.exists() else {}
    except ChildFailedError as failure:
        raise _failure(job_dir, job.filename, failure) from None
    except SignalException as stop:
        raise KeyboardInterrupt(f"%%tpu_distributed: stopped every worker ({stop.sigval.name})") from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        elastic_log.setLevel(log_level)
        shutil.rmtree(job_dir, ignore_errors=True)


def _failure(job_dir: Path, filename: str, failure: Any) -> DistributedCellError:
    """The rank that failed first, in words: its error and the cell line it came from (the
    others usually failed because it did: a collective lost its peer)."""
    reports = sorted(
        (json.loads(path.read_text()) for path in job_dir.glob(f"{ERROR_FILE}.*")), key=lambda r: r["time"]
    )
    if reports:
        first = reports[0]
        where = f" at {filename}, line {first['line']}" if first["line"] else ""
        return DistributedCellError(
            f"rank {first['rank']} failed{where}: {first['error']}: {first['message']} "
            f"(its traceback is above, lines prefixed [rank {first['rank']}]); every worker was stopped"
        )
    rank, process = failure.get_first_failure()  # no report: it died (a signal, the OOM killer)
    return DistributedCellError(
        f"rank {rank} exited with code {process.exitcode} before finishing the cell; every worker was stopped"
    )
