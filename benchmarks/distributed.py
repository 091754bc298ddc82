"""What ``%%tpu_distributed`` adds to starting workers: a trivial 2-rank cell, launched the
way the magic does it (in-process elastic launcher) against the same job run by ``torchrun``
in a subprocess (the baseline users would otherwise type).

    python -m benchmarks.distributed [--workers N] [--rounds N]

Both start N fresh Python processes that import torch and initialise a gloo process group,
which dominates; the ratio says whether tpunb's packing, output tailing and result return
cost anything on top.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CELL = "import torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nresult = float(t)\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    from tpunb.distributed import build_job, run_job
    from tpunb.distributed.cell import save_for_torchrun

    job = build_job(
        CELL,
        {"torch": torch},
        first_line=2,
        filename="Cell In[1]",
        mode="strict",
        backend="gloo",
        returns=("result",),
    )
    saved = Path(tempfile.mkdtemp(prefix="tpunb-bench-"))
    save_for_torchrun(job, saved, args.workers)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.workers}",
    ]
    torchrun += ["-m", "tpunb.distributed.worker", str(saved)]

    def magic() -> float:
        started = time.perf_counter()
        assert run_job(job, args.workers) == {"result": float(args.workers)}
        return time.perf_counter() - started

    def baseline() -> float:
        started = time.perf_counter()
        subprocess.run(torchrun, check=True, capture_output=True)
        return time.perf_counter() - started

    magic_s, torchrun_s = [], []
    for _ in range(args.rounds):
        magic_s.append(magic())
        torchrun_s.append(baseline())
    ours, theirs = statistics.median(magic_s), statistics.median(torchrun_s)
    print(f"{args.workers} workers, median of {args.rounds}: %%tpu_distributed {ours:.2f} s, ", end="")
    print(f"torchrun subprocess {theirs:.2f} s, ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
