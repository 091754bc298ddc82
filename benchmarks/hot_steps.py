"""Hot optimizer steps: a training loop's step time in fused mode (model call and optimizer
step compiled whole) against strict, the recorder alone, and PyTorch's compile recipes.

    python -m benchmarks.hot_steps [--steps 25] [--rounds 5] [--threads 1]

Two MLPs (a shallow one, 4 parameter tensors, and a deep one, 26), AdamW with weight decay
and StepLR, the learning rate also set by hand each step, a loss read with ``.item()`` every
step. Ways, each on its own copy of the model: strict; fused as by default (hot training
calls and hot optimizer steps); fused with ``hot_training=False`` (the recorder alone);
``torch.compile(model)`` with an eager optimizer; and ``torch.compile`` of both the model and
``optimizer.step`` (PyTorch's compiled-optimizer recipe). Rounds time ``--steps`` steps of
each in turn after warm-up steps (fused: until its calls run compiled code, ``settle``), so a busy moment
of the machine slows all alike; the table gives the median ms/step and the ratio to strict.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from benchmarks.rounds import parse_rounds

WARM_UP_STEPS = 12


def main() -> None:
    args = parse_rounds(__doc__.splitlines()[0], steps=25)
    import torch

    import tpunb

    print(f"torch {torch.__version__}, {tpunb.runtime().name}, {args.threads} thread(s)")
    print(f"{'model':<8} {'way':<22} {'ms/step':>8} {'vs strict':>9}")
    for name, depth in (("shallow", 0), ("deep", 12)):
        times = measure(depth, args.steps, args.rounds)
        strict = times["strict"]
        for way, ms in times.items():
            print(f"{name:<8} {way:<22} {ms:8.3f} {strict / ms:8.2f}x")


def measure(depth: int, steps: int, rounds: int) -> dict[str, float]:
    """Median ms/step of each way on an MLP with ``depth`` hidden blocks."""
    import torch

    ways = {
        "strict": Way(depth),
        "fused, hot training": Way(depth, fused={}),
        "fused, recorder alone": Way(depth, fused={"hot_training": False}),
        "compile(model)": Way(depth, compiled_model=True),
        "compile(model, step)": Way(depth, compiled_model=True, compiled_step=True),
    }
    for way in ways.values():
        way.run(WARM_UP_STEPS)
        settle(way)
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            samples[name].append(way.run(steps) * 1000 / steps)
    torch._dynamo.reset()
    return {name: statistics.median(values) for name, values in samples.items()}


#: Rounds of a few steps and a wait for the worker before a fused way counts as warm.
SETTLE_ROUNDS = 8
#: What a warm step's calls compiled whole say (their records' statuses).
WARM = {"hit"}


def settle(way: Way) -> None:
    """Run a fused way until its model call and optimizer step run compiled code: a call that
    met the worker compiling ran as it is and is captured (and compiled) at a later one, so
    one wait is not enough (the optimizer's first capture waits for the model's compile, and
    a changed learning rate recompiles it once more)."""
    import tpunb

    if way.fused is None:
        return
    for _ in range(SETTLE_ROUNDS):
        tpunb.runtime().wait_for_background_compiles()
        way.run(3)
        whole = [g for g in tpunb.stats()["groups"][-6:] if g["whole_call"]]
        if whole and {g["status"] for g in whole} <= WARM:
            return


class Way:
    """One model, optimizer and schedule, trained in one way."""

    def __init__(
        self,
        depth: int,
        fused: dict[str, Any] | None = None,
        compiled_model: bool = False,
        compiled_step: bool = False,
    ) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        blocks = [nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(depth)]
        self.model = nn.Sequential(nn.Linear(12, 64), nn.GELU(), *blocks, nn.Linear(64, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=5e-3, weight_decay=0.01)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=10, gamma=0.9)
        self.call = torch.compile(self.model) if compiled_model else self.model
        # (the optimizer's own step is looked up at each call, where tpunb puts a hot step)
        self.compiled_step = torch.compile(self.optimizer.step) if compiled_step else None
        self.fused = fused  # options of tpunb.mode("fused"); None: strict cells
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 12, generator=generator)
        self.y = self.x[:, :1] * 0.5 + 0.1 * torch.randn(64, 1, generator=generator)
        self.index = 0

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` training steps."""
        import torch

        import tpunb

        scope = tpunb.mode("fused", **self.fused) if self.fused is not None else contextlib.nullcontext()
        started = time.perf_counter()
        with scope:
            for _ in range(steps):
                rows = slice(self.index % 4 * 16, self.index % 4 * 16 + 16)
                self.optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(self.call(self.x[rows]), self.y[rows])
                loss.backward()
                (self.compiled_step or self.optimizer.step)()
                self.scheduler.step()
                for group in self.optimizer.param_groups:
                    group["lr"] = group["lr"] * 0.999
                loss.item()
                self.index += 1
        return time.perf_counter() - started


if __name__ == "__main__":
    main()
