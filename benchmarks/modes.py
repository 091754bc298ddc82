"""Strict vs fused vs torch.compile on three workloads, plus the fused engine's overheads.

    python -m benchmarks.modes [--threads N] [--workloads chain,mlp,transformer,overhead]

Every number is a median of repeats measured in this one run; ratios are against strict
(plain eager) from the same run. "fused first" is a fresh engine's first call with a
synchronous compile into an empty Inductor cache (the worst case; by default a group replays
op by op until it comes back, then compiles in a background thread while it keeps replaying,
which costs about what strict does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Row:
    workload: str
    strict_ms: float
    fused_ms: float
    fused_first_s: float
    compile_ms: float
    graphs: int

    def cells(self) -> list[str]:
        return [
            self.workload,
            f"{self.strict_ms:9.2f}",
            f"{self.fused_ms:9.2f}",
            f"{self.strict_ms / self.fused_ms:6.2f}x",
            f"{self.fused_first_s:8.1f}",
            f"{self.compile_ms:9.2f}",
            f"{self.strict_ms / self.compile_ms:6.2f}x",
            f"{self.fused_ms / self.compile_ms:6.2f}",
            str(self.graphs),
        ]


HEADER = [
    "workload",
    "strict ms",
    "fused ms",
    "speedup",
    "first s",
    "compile ms",
    "speedup",
    "fused/cmp",
    "graphs",
]


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


# --- workloads: each returns (make_state, step) where step(state) runs one unit of work ----------


def chain_workload():
    import torch

    def make():
        return {"x": torch.randn(2000, 2000)}

    def step(state):
        y = state["x"]
        for _ in range(50):
            y = y + 1
            y = y * 2
            y = y - 1
        return y.cpu()

    return make, step, []


def mlp_workload():
    import torch

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data, labels = torch.randn(64, 784), torch.randint(0, 10, (64,))
        return {"model": model, "opt": opt, "data": data, "labels": labels}

    return make, _train_step, ["model", "opt"]


def transformer_workload():
    import torch

    class Encoder(torch.nn.Module):
        """MiniLM-L6 sized: 6 layers, hidden 384, 12 heads, FFN 1536, synthetic weights."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(30522, 384)
            self.position = torch.nn.Embedding(64, 384)
            layer = torch.nn.TransformerEncoderLayer(
                384, 12, 1536, dropout=0.1, batch_first=True, activation="gelu"
            )
            self.layers = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = torch.nn.Linear(384, 5)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1])
            hidden = self.layers(self.embed(tokens) + self.position(positions))
            return self.head(hidden.mean(dim=1))

    def make():
        torch.manual_seed(0)
        model = Encoder()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        data, labels = torch.randint(0, 30522, (16, 64)), torch.randint(0, 5, (16,))
        return {"model": model, "opt": opt, "data": data, "labels": labels}

    return make, _train_step, ["model", "opt"]


def _train_step(state):
    import torch.nn.functional as F

    loss = F.cross_entropy(state["model"](state["data"]), state["labels"])
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss.item()


WORKLOADS = {"chain": chain_workload, "mlp": mlp_workload, "transformer": transformer_workload}
REPEATS = {"chain": 10, "mlp": 30, "transformer": 5}


def measure(name: str) -> Row:
    import torch

    from tpunb.fuse import FuseOptions, FusionEngine

    make, step, adopt_keys = WORKLOADS[name]()
    repeats = REPEATS[name]

    state = make()
    strict = median_ms(lambda: step(state), repeats)

    state = make()
    engine = FusionEngine(torch.device("cpu"))
    options = FuseOptions(sync_compile=True)
    started = time.perf_counter()
    with engine.scope(options, adopt=tuple(state[k] for k in adopt_keys)):
        step(state)
    first = time.perf_counter() - started

    def fused_step():
        with engine.scope(options):
            step(state)

    fused = median_ms(fused_step, repeats, warmup=3)

    state = make()
    compiled = torch.compile(step)
    compiled_ms = median_ms(lambda: compiled(state), repeats, warmup=3)
    return Row(name, strict, fused, first, compiled_ms, engine.stats()["graphs"])


def overheads() -> list[str]:
    """Capture cost per op (10k tiny ops) and a cache-hit flush of a 150-op group."""
    import torch

    from tpunb.fuse import FuseOptions, FusionEngine

    x = torch.randn(4)

    def eager_ops():
        y = x
        for _ in range(10_000):
            y = y + 1.0

    eager_us = median_ms(eager_ops, 5) / 10
    engine = FusionEngine(torch.device("cpu"))
    record_times = []
    for _ in range(5):
        with engine.scope(FuseOptions(compile=False, max_ops=1_000_000)):
            started = time.perf_counter()
            y = x
            for _ in range(10_000):
                y = y + 1.0
            record_times.append((time.perf_counter() - started) * 1e6 / 10_000)
    capture_us = statistics.median(record_times)

    engine = FusionEngine(torch.device("cpu"))
    options = FuseOptions(sync_compile=True)
    flush_times = []
    for _ in range(25):
        with engine.scope(options):
            y = x
            for _ in range(50):
                y = y + 1.0
                y = y * 2.0
                y = y - 1.0
            started = time.perf_counter()
            engine.flush("benchmark")
            flush_times.append((time.perf_counter() - started) * 1e6)
    hit_us = statistics.median(flush_times[5:])
    cell_us = _compile_cell_overhead_us()
    lines = [
        f"eager op:                    {eager_us:7.1f} us/op",
        f"fused capture (record):      {capture_us:7.1f} us/op  ({capture_us / eager_us:.1f}x eager)",
        f"cache-hit flush, 150 ops:    {hit_us:7.1f} us",
        f"compile-mode cell, no tensor work, after its first run: {cell_us:7.1f} us",
    ]
    strict_us, fused_us = _step_run_as_strict()
    lines.append(
        f"a tiny MLP's SGD step run as strict runs it in a fused scope (its compile not paid off): "
        f"strict {strict_us:5.1f} us, fused {fused_us:5.1f} us (+{fused_us - strict_us:.1f} us, "
        f"{strict_us / fused_us:.2f}x strict's speed)"
    )
    for foreach in (False, None):
        ops, strict_us, fused_us = _repeated_step(foreach)
        chosen = "foreach=False: the same ops in both" if foreach is False else "AdamW left to choose"
        lines.append(
            f"repeated {ops}-op training step ({chosen}): strict {strict_us:5.1f} us/op, "
            f"fused {fused_us:5.1f} us/op ({fused_us / strict_us:.1f}x strict)"
        )
    return lines


def _step_run_as_strict() -> tuple[float, float]:
    """A three-layer MLP's whole step (forward, loss, zero_grad, backward, SGD step, item), in
    strict mode and in one fused scope whose hot call and step run eagerly, their compile not
    paid off (the default): what the engine's own work adds to a step no compile would repay,
    the 0.3-0.5 ms steps of the workloads benchmark's small loops. Medians of 5 blocks of 2000
    steps each, strict's and fused's in turn (a machine that slows down slows both), each
    fused block a scope of its own after one of 50 steps (the first are recorded while the
    model turns hot)."""
    import torch

    from tpunb.fuse import FuseOptions, FusionEngine

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 8)

    def steps(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            loss = model(data).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
        return (time.perf_counter() - started) * 1e6 / count

    engine = FusionEngine(torch.device("cpu"))
    with engine.scope(FuseOptions(), adopt=(model, opt)):
        steps(50)
    strict, fused = [], []
    for _ in range(5):
        strict.append(steps(2000))
        with engine.scope(FuseOptions(), adopt=(model, opt)):
            fused.append(steps(2000))
    return statistics.median(strict), statistics.median(fused)


def _repeated_step(foreach: bool | None) -> tuple[int, float, float]:
    """A tiny MLP's AdamW step, repeated: its time per op (the ops strict mode runs) in strict
    and in fused mode once compiled, where recording dominates: the known path's cost."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from tpunb.fuse import FuseOptions, FusionEngine

    def make():
        torch.manual_seed(0)
        layers = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(8, 4))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)

    data, labels = torch.randn(8, 8), torch.randint(0, 4, (8,))

    def step(model, opt):
        loss = F.cross_entropy(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    model, opt = make()
    step(model, opt)
    with Count():
        step(model, opt)
    strict_ms = median_ms(lambda: step(model, opt), 200, warmup=5)
    model, opt = make()
    engine, options = FusionEngine(torch.device("cpu")), FuseOptions(sync_compile=True)

    def fused():
        with engine.scope(options, adopt=(model, opt)):
            step(model, opt)

    fused_ms = median_ms(fused, 200, warmup=6)
    return Count.ops, strict_ms * 1000 / Count.ops, fused_ms * 1000 / Count.ops


def _compile_cell_overhead_us() -> float:
    """What compile mode adds to a cell with no tensor work, once the cell has run once."""
    import ast

    import torch

    from tpunb.cellcompile import CellCompiler

    source = "total = sum(range(10))\nlabel = f'{total} items'\nlabel"
    compiler = CellCompiler(lambda fn: torch.compile(fn, backend="inductor"), lambda record: None)
    namespace: dict = {}
    compiler.run(ast.parse(source), source, "<bench>", namespace, None)  # first run: Dynamo looks
    return median_ms(lambda: compiler.run(ast.parse(source), source, "<bench>", namespace, None), 50) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1, help="OpenMP/torch threads (default 1)")
    parser.add_argument("--workloads", default="chain,mlp,transformer,overhead")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tpunb-bench-inductor-"))
    import torch

    torch.set_num_threads(args.threads)
    chosen = args.workloads.split(",")
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    print(f"torch {torch.__version__}, {args.threads} thread(s), Inductor cache {cache}")
    rows = [measure(name) for name in chosen if name in WORKLOADS]
    if rows:
        table = [HEADER] + [row.cells() for row in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
        for r in table:
            print("  ".join(cell.rjust(width) for cell, width in zip(r, widths, strict=True)))
        print(
            "speedup = strict / fused (or / torch.compile); fused/cmp = fused / torch.compile (lower: better)"
        )
    if "overhead" in chosen:
        print("\n".join(overheads()))


if __name__ == "__main__":
    main()
