"""One worker of a ``%%tpu_distributed`` cell: ``python -m tpunb.distributed.worker JOB_DIR``.

The elastic launcher starts it with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous address in the environment. It initialises the process group, runs the cell in
the notebook's mode with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``DEVICE`` defined,
and on rank 0 saves the values the cell asked to return. A failure prints the traceback
(the cell's lines only) and leaves a short report for the notebook; the exit status tells
the launcher to stop the other ranks.
"""

from __future__ import annotations

import importlib
import json
import linecache
import os
import sys
import time
import traceback
from pathlib import Path

import cloudpickle

from tpunb.distributed.files import ERROR_FILE, JOB_FILE, RESULT_FILE


def run(job_dir: Path) -> int:
    import torch.distributed as dist

    import tpunb
    from tpunb.distributed.backend import init_worker

    job = cloudpickle.loads((job_dir / JOB_FILE).read_bytes())
    rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    # tracebacks show the cell's lines, as IPython's do
    linecache.cache[job.filename] = (len(job.source), None, job.source.splitlines(True), job.filename)
    try:
        namespace = {"__name__": "__main__", "RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank}
        namespace["DEVICE"] = init_worker(job.backend, local_rank)
        namespace.update((name, importlib.import_module(module)) for name, module in job.imports)
        namespace.update(cloudpickle.loads(job.variables))
        with tpunb.mode(job.mode):
            exec(compile(job.source, job.filename, "exec"), namespace)
        if rank == 0 and job.returns:
            missing = [name for name in job.returns if name not in namespace]
            if missing:
                raise NameError(
                    f"--return {' '.join(missing)}: rank 0 has no variable named so after the cell"
                )
            (job_dir / RESULT_FILE).write_bytes(cloudpickle.dumps({n: namespace[n] for n in job.returns}))
    except BaseException as error:
        report_failure(job_dir, job.filename, rank, error)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def report_failure(job_dir: Path, filename: str, rank: int, error: BaseException) -> None:
    """Print the traceback from the cell's first frame on, and leave the notebook a summary."""
    frames = traceback.extract_tb(error.__traceback__)
    in_cell = [i for i, frame in enumerate(frames) if frame.filename == filename]
    shown = frames[in_cell[0] :] if in_cell else frames
    line = next((f.lineno for f in reversed(frames) if f.filename == filename), None)
    text = "".join(traceback.format_list(shown)) + "".join(traceback.format_exception_only(error))
    print(f"Traceback (most recent call last):\n{text}", file=sys.stderr, end="", flush=True)
    report = {
        "rank": rank,
        "error": type(error).__name__,
        "message": str(error),
        "line": line,
        "time": time.time(),
    }
    (job_dir / f"{ERROR_FILE}.{rank}").write_text(json.dumps(report))


def main() -> None:
    status = run(Path(sys.argv[1]))
    # Leave without the interpreter's teardown: c10d's and gloo's C++ threads can abort the
    # process there ("terminate called without an active exception", seen about one run in
    # ten on 2 ranks), which would turn a finished cell into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
