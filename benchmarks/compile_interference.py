"""How much a background compile slows the notebook's thread: a small eager training step
timed alone, then while tpunb's compile worker compiles fused groups.

    python -m benchmarks.compile_interference [--groups N]

Fused mode compiles on a thread of the kernel's process, so the compile and the notebook's
code share the interpreter's lock. The step (an MLP's forward, backward and AdamW update,
about 40 small ops, each of which releases the lock and must take it back) is timed in
strict mode, with no tpunb scope, so what is measured is the interference alone. The worker
compiles ``--groups`` distinct groups through the engine's own path (``inductor_compile`` on
``CompileWorker``, with its short thread switch interval), each new to Inductor's caches (a
fresh cache directory), then the same groups again, from Inductor's caches. The ratio is
slowed/alone (1.0: no interference); one thread (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpunb-interference-")

    import torch

    from tpunb.fuse.groups.graph import inductor_compile
    from tpunb.fuse.groups.worker import CompileWorker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.GELU(), torch.nn.Linear(48, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 12), torch.randn(16, 1)

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        return time.perf_counter() - started

    def graph(salt: int) -> torch.fx.GraphModule:
        """A group's graph, traced here: FX's tracer patches ``nn.Module.__call__`` process-wide
        while it runs, so tracing on the worker broke the step's module calls meanwhile."""
        return torch.fx.symbolic_trace(lambda a, b: ((a @ b).relu() * (salt + 0.5)).tanh().sum(0))

    def compile_job(traced: torch.fx.GraphModule) -> None:
        inductor_compile(traced, [torch.randn(16, 16), torch.randn(16, 16)])

    worker = CompileWorker()
    first = graph(-1)
    worker.submit(lambda: compile_job(first), wait=True)  # imports and the worker's one-time set-up
    alone = statistics.median(step() for _ in range(200))
    print(f"step alone: {alone * 1000:.2f} ms")
    # new to Inductor's caches (the C++ compiler's time, the lock free), then the same groups
    # again, from the caches (Inductor's Python alone, as after a kernel restart)
    for what in ("new groups", "the same groups, cached"):
        started = time.perf_counter()
        graphs = [graph(salt) for salt in range(args.groups)]
        jobs = [worker.submit(lambda traced=traced: compile_job(traced), wait=False) for traced in graphs]
        during = []
        while not all(job.done() for job in jobs):
            during.append(step())
        compile_s = time.perf_counter() - started
        slowed = statistics.median(during) if during else float("nan")
        print(
            f"{what:<24} compiled in {compile_s:5.2f} s; the step meanwhile: {slowed * 1000:6.2f} ms "
            f"({slowed / alone:.1f}x alone, {len(during)} steps)"
        )


if __name__ == "__main__":
    main()
