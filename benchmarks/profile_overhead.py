"""What profiling adds: the MLP training step of benchmarks.modes, with and without ``tpunb.profile()``.

    python -m benchmarks.profile_overhead [--steps 30] [--rounds 5] [--threads 1]

For strict and fused mode, in one run: rounds of ``--steps`` training steps, alternately
unprofiled and inside ``tpunb.profile()`` (so a busy moment of the machine slows both
alike). "in block" is the steps' time inside the profiled block (torch.profiler recording
every op, the wait watcher on every read); "report s" is what the report costs after the
block (the profiler's tables, the trace file, the findings). The goal: in-block time at most
1.5x unprofiled.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from benchmarks.rounds import parse_rounds


def main() -> None:
    args = parse_rounds(__doc__.splitlines()[0], steps=30)
    import torch

    import tpunb
    from benchmarks.modes import mlp_workload

    make, step, adopt = mlp_workload()
    trace_dir = tempfile.mkdtemp(prefix="tpunb-bench-profiles-")
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} MLP steps a round")
    print(f"{'mode':<8} {'plain ms':>9} {'in block ms':>12} {'ratio':>6} {'report s':>9}")
    for mode in ("strict", "fused"):
        state = make()
        tpunb.adopt(*[state[name] for name in adopt])

        def steps(state=state) -> float:
            started = time.perf_counter()
            for _ in range(args.steps):
                step(state)
            return time.perf_counter() - started

        with tpunb.mode(mode, sync_compile=True) if mode == "fused" else tpunb.mode(mode):
            steps()  # compiles (fused), warms the allocator
        plain, profiled, reports = [], [], []
        for _ in range(args.rounds):
            with tpunb.mode(mode):
                plain.append(steps())
            with tpunb.profile(mode=mode, trace=trace_dir) as report:
                profiled.append(steps())
                ended = time.perf_counter()
            report.text()
            reports.append(time.perf_counter() - ended)
        per_step = 1000 / args.steps
        plain_ms, block_ms = statistics.median(plain) * per_step, statistics.median(profiled) * per_step
        print(
            f"{mode:<8} {plain_ms:9.3f} {block_ms:12.3f} {block_ms / plain_ms:5.2f}x "
            f"{statistics.median(reports):9.2f}"
        )


if __name__ == "__main__":
    main()
