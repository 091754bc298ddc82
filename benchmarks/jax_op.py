"""The cost of a ``tpunb.jax_op`` against the same math in torch, on the CPU.

    python -m benchmarks.jax_op [--rounds N] [--threads N]

Three ratios, each against a baseline in the same run:

* call overhead: a tiny GELU-and-scale (8 values) as a JAX op vs torch ops: what crossing to
  JAX and back costs per call (custom-op dispatch, DLPack both ways, a jit-cache lookup);
* large tensor: the same on 4M values, where the hand-off is zero-copy and JAX's fused
  kernel competes with torch's two ops;
* a forced copy: the large case with the input made non-contiguous, so the bridge must copy
  it first (what a hand-off costs when it is not zero-copy).

Reports the median time per call of each, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable


def per_call_ms(fn: Callable[[], object], calls: int, rounds: int) -> float:
    fn()  # warm-up: compiles
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) * 1000 / calls)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import jax
    import torch
    import torch.nn.functional as F

    import tpunb

    torch.set_num_threads(args.threads)

    @tpunb.jax_op
    def gelu_scale(x):
        return jax.nn.gelu(x, approximate=True) * 2.0

    def torch_gelu_scale(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh") * 2.0

    tiny, large = torch.randn(8), torch.randn(2048, 2048)
    strided = torch.randn(2048, 4096)[:, ::2]  # same size as `large`, not contiguous
    rows = [
        ("call overhead (8 values)", tiny, tiny, 2000),
        ("large tensor (4M values)", large, large, 20),
        ("forced copy (4M, strided)", strided, large, 20),
    ]
    print(f"{'case':<28}{'torch ms':>10}{'jax_op ms':>11}{'ratio':>8}")
    with torch.no_grad():
        for label, jax_input, torch_input, calls in rows:
            baseline = per_call_ms(lambda t=torch_input: torch_gelu_scale(t), calls, args.rounds)
            measured = per_call_ms(lambda t=jax_input: gelu_scale(t), calls, args.rounds)
            print(f"{label:<28}{baseline:>10.4f}{measured:>11.4f}{measured / baseline:>8.2f}")


if __name__ == "__main__":
    main()
