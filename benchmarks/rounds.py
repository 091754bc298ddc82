"""What the step-time benchmarks share: ``--steps``, ``--rounds`` and ``--threads``, a fresh
Inductor cache, and torch set to the thread count (benchmarks.precision, profile_overhead)."""

from __future__ import annotations

import argparse
import os
import tempfile


def parse_rounds(description: str, steps: int) -> argparse.Namespace:
    """The command line, parsed; torch is imported and threaded after the cache is set."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tpunb-bench-inductor-"))
    import torch

    torch.set_num_threads(args.threads)
    return args
