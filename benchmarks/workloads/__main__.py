"""Others' training loops in every mode against strict: the real-workload table.

    python -m benchmarks.workloads [--workloads hf_trainer,lightning] [--modes strict,fused,...]
                                   [--precisions fp32,bf16] [--steps N] [--device xla]

Each workload runs in a fresh kernel on this interpreter, one thread (``OMP_NUM_THREADS=1``);
per workload, precision and mode the table gives the largest loss difference against strict
(absolute and relative, over every logged step), whether the random stream matched, the
steady ms/step and the first step's seconds, and the ratio of strict's ms/step to the mode's
(above 1: faster than strict); then the cell's seconds (to its last step) and strict's against
them, which a first run's compiles weigh on. JSON goes to ``test-artifacts/workloads.json``.
``--device xla`` runs the workloads that apply on PyTorch/XLA's CPU device, in kernels on the
xla runtime (an interpreter with torch_xla: ``.venv-colab``), without fused-recorded (hot training
is native only: there fused is already the recorder).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.workloads.catalog import WORKLOADS, missing_packages
from benchmarks.workloads.harness import MODES, PRECISIONS, Comparison, Run, comparisons, run_workload

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the workload's)")
    parser.add_argument("--device", choices=("cpu", "xla"), default="cpu")
    args = parser.parse_args()
    for option, given, known in (
        ("--workloads", args.workloads, WORKLOADS),
        ("--modes", args.modes, MODES),
        ("--precisions", args.precisions, PRECISIONS),
    ):
        if unknown := [name for name in given.split(",") if name not in known]:
            parser.error(f"{option}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    sys.path[:0] = [str(ROOT / "tests" / "kernel"), str(ROOT / "tests" / "xla")]
    from tpunb_kernels import start_kernel  # the project's one kernel client
    from xla_kernels import XLA_ENV

    on_xla = args.device == "xla"
    names = [n for n in args.workloads.split(",") if WORKLOADS[n].on_xla or not on_xla]
    modes = [m for m in args.modes.split(",") if not (on_xla and m.startswith("fused-recorded"))]
    runs: list[Run] = []
    for name in names:
        workload = WORKLOADS[name]
        if missing := missing_packages(workload):
            print(f"{name}: skipped, not installed: {', '.join(missing)}", flush=True)
            continue
        folder = Path(tempfile.mkdtemp(prefix="tpunb-workloads-"))
        kernel = start_kernel(folder, env=XLA_ENV if on_xla else None)  # one thread
        try:
            loaded = kernel.run("%load_ext tpunb", timeout=300)
            assert loaded.error is None, loaded.error
            done = run_workload(kernel, workload, modes, args.precisions.split(","), args.steps, args.device)
        finally:
            kernel.shutdown()
        runs += done
        _print_table(done, comparisons(done))
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "workloads.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    _print_geomeans(runs)
    return 0 if all(c.ok for c in comparisons(runs)) else 1


def _print_table(runs: list[Run], compared: list[Comparison]) -> None:
    by_run = {id(c.run): c for c in compared}
    strict = {r.precision: r for r in runs if r.mode == "strict"}
    print(
        f"\n{'workload':<14} {'prec':<5} {'mode':<11} {'max |dloss|':>11} {'max rel':>9} {'stream':>7} "
        f"{'ms/step':>9} {'first s':>8} {'vs strict':>9} {'cell s':>7} {'cell vs':>7}  status"
    )
    for run in runs:
        c = by_run.get(id(run))
        base = strict[run.precision].ms_per_step
        ratio = f"{base / run.ms_per_step:.2f}x" if base and run.ms_per_step else "n/a"
        base_cell = strict[run.precision].cell_s
        cell = f"{run.cell_s:.2f}" if run.cell_s else "n/a"
        cell_ratio = f"{base_cell / run.cell_s:.2f}x" if base_cell and run.cell_s else "n/a"
        diff = f"{c.max_abs:.2e}" if c else "-"
        rel = f"{c.max_rel:.1e}" if c else "-"
        stream = ("same" if c.same_stream else "DIFF") if c else "-"
        status = "ok" if c is None or c.ok else "; ".join(c.problems)
        ms = f"{run.ms_per_step:.1f}" if run.ms_per_step else "n/a"
        first = f"{run.first_step_s:.2f}" if run.first_step_s is not None else "n/a"
        print(
            f"{run.workload:<14} {run.precision:<5} {run.mode:<11} {diff:>11} {rel:>9} {stream:>7} "
            f"{ms:>9} {first:>8} {ratio:>9} {cell:>7} {cell_ratio:>7}  {status}",
            flush=True,
        )
        if run.summary and run.mode != "strict":
            for line in run.summary.splitlines():
                print(f"{'':<14} {line}")


def _print_geomeans(runs: list[Run]) -> None:
    strict = {(r.workload, r.precision): r.ms_per_step for r in runs if r.mode == "strict"}
    print("\ngeomean speed vs strict (ms/step, after warm-up):")
    for mode in MODES[1:]:
        ratios = [
            strict[(r.workload, r.precision)] / r.ms_per_step
            for r in runs
            if r.mode == mode and r.ms_per_step and strict.get((r.workload, r.precision))
        ]
        if ratios:
            geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"  {mode:<11} {geomean:.2f}x over {len(ratios)} runs (min {min(ratios):.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
