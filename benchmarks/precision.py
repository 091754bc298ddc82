"""bf16 against fp32: the step time of a training step and of inference, per mode, on this
runtime (``TPUNB_RUNTIME`` picks it, as in a notebook).

    python -m benchmarks.precision [--steps 20] [--rounds 5] [--threads 1]

For strict and fused mode and each precision the runtime accepts, in one run: rounds that
time ``--steps`` steps of each in turn (so a busy moment of the machine slows all alike),
after warm-up steps (fused: compiled). The workload is benchmarks.modes' MLP (784-1024-10,
batch 64, AdamW). A CPU gains only with bf16 instructions (AVX512-BF16, AMX); without them
(most laptops) bf16 is emulated and slower. TPUs and recent GPUs are built for it.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.rounds import parse_rounds


def main() -> None:
    args = parse_rounds(__doc__.splitlines()[0], steps=20)
    import torch

    import tpunb
    from benchmarks.modes import mlp_workload

    make, step, adopt = mlp_workload()
    precisions = tpunb.stats()["precisions_available"]
    runtime = tpunb.runtime()
    print(f"torch {torch.__version__}, {runtime.name} on {runtime.device}, {args.threads} thread(s)")
    ways = {}
    for mode in ("strict", "fused"):
        for precision in precisions:
            state = make()
            tpunb.adopt(*[state[name] for name in adopt])
            ways[(mode, precision)] = state
    times: dict[tuple[str, str], list[float]] = {way: [] for way in ways}

    def run(way: tuple[str, str], steps: int) -> float:
        mode, precision = way
        options = {"sync_compile": True} if mode == "fused" else {}
        with tpunb.precision(precision), tpunb.mode(mode, **options):
            started = time.perf_counter()
            for _ in range(steps):
                step(ways[way])
            return time.perf_counter() - started

    for way in ways:
        run(way, 3)  # warm-up: fused compiles here
    for _ in range(args.rounds):
        for way in ways:
            times[way].append(run(way, args.steps))
    print(f"{'mode':<8} {'precision':<10} {'step ms':>8} {'vs fp32':>8}")
    for (mode, precision), seconds in times.items():
        ms = statistics.median(seconds) * 1000 / args.steps
        fp32 = statistics.median(times[(mode, "fp32")]) * 1000 / args.steps
        print(f"{mode:<8} {precision:<10} {ms:8.2f} {fp32 / ms:7.2f}x")


if __name__ == "__main__":
    main()
