"""A ``%run`` training script whose step recompiles at every step, in a real kernel: strict,
tpunb's compile mode, and ``torch.compile`` of the script's ``train`` in a strict cell.

    python -m benchmarks.compile_storm [--steps 200] [--width 256] [--batch 64]

The script (``benchmarks/scripts/storm_train.py``) passes its learning rate as a new Python
float every step, so Dynamo guards the step's resume function on it. Each configuration runs
the script in a kernel with empty Inductor caches (a user's first run), again in the same
kernel (running the cell again), then in a new kernel on the same disk cache (the next day).
The times are the cells' wall times, compiles included; ratios are strict/configuration from
the same run (above 1.0: faster than strict); graphs are what each run compiled. One thread
(``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scripts" / "storm_train.py"
#: (label, the cell's first line, arguments added to the script's)
CONFIGS = (
    ("strict", "", ""),
    ("tpunb compile mode", "%%tpu_mode compile\n", ""),
    ("torch.compile(train)", "", " --torch-compile"),
)


def _runs(start_kernel: Any, folder: Path, cell: str, times: int) -> tuple[list[float], list[int], Any]:
    """``cell`` run ``times`` times in one new kernel on ``folder``'s Inductor cache: the cells'
    seconds, the graphs each compiled, and the last run's losses."""
    kernel = start_kernel(folder, env={"TPUNB_CACHE_DIR": str(folder / "inductor")})
    try:
        loaded = kernel.run("%load_ext tpunb\nimport torch\nfrom torch._dynamo.utils import counters")
        assert loaded.error is None, loaded.error
        seconds, graphs = [], []
        for _ in range(times):
            before = kernel.value("counters['stats']['unique_graphs']")
            started = time.perf_counter()
            result = kernel.run(cell, timeout=1800)
            seconds.append(time.perf_counter() - started)
            assert result.error is None, result.error
            graphs.append(kernel.value("counters['stats']['unique_graphs']") - before)
        return seconds, graphs, kernel.value("losses")
    finally:
        kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "kernel"))
    from tpunb_kernels import start_kernel  # the project's one kernel client

    sizes = f" --steps {args.steps} --width {args.width} --batch {args.batch}"
    print(
        f"storm_train.py{sizes}: seconds per cell: the first run (empty caches), the same cell again, "
        "the first run in a new kernel (Inductor's disk cache warm); strict/that; graphs compiled"
    )
    baseline: list[float] = []
    strict_losses: list[float] = []
    for label, header, extra in CONFIGS:
        folder = Path(tempfile.mkdtemp(prefix="tpunb-storm-"))
        cell = f"{header}%run {SCRIPT}{sizes}{extra}"
        times, graphs, losses = _runs(start_kernel, folder, cell, 2)
        again, again_graphs, _ = _runs(start_kernel, folder, cell, 1)
        times, graphs = times + again, graphs + again_graphs
        baseline, strict_losses = baseline or times, strict_losses or losses  # strict's row is first
        worst = max(abs(a - b) for a, b in zip(losses, strict_losses, strict=True))
        print(
            f"{label:<22} "
            + "  ".join(f"{t:6.2f} s {b / t:5.2f}x" for b, t in zip(baseline, times, strict=True))
            + f"   graphs {', '.join(map(str, graphs))}   max |loss - strict| {worst:.1e}"
        )


if __name__ == "__main__":
    main()
