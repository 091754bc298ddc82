"""HF ``Trainer.train()`` in strict and fused mode: steady step time once warm, in one run.

    python -m benchmarks.trainer [--model bert] [--size tiny] [--steps 60] [--threads 1]

The way most Hugging Face users train: the Trainer makes its optimizer and LR schedule
inside ``train()``, clips gradients, checks each loss for NaN and logs every few steps.
A callback stamps the end of every step; the steady step time is the median over the last
half of the steps (fused mode compiles its groups synchronously on first sighting, so the
first steps hold the compiles and the later ones run warm). Ratios are against strict
measured in the same run. Models come from the model suite (``benchmarks/hf_suite.py``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time


def run(model_name: str, size: str, steps: int, fused: bool) -> dict[str, float]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from benchmarks.hf_suite import build
    from tpunb.fuse import FuseOptions, FusionEngine

    model, inputs = build(model_name, size)
    batch = len(next(iter(inputs.values())))

    class Rows(torch.utils.data.Dataset):
        """The suite's batch, row by row: each item a fresh view, as a tokenised dataset gives."""

        def __len__(self) -> int:
            return batch * steps

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {key: value[index % batch] for key, value in inputs.items()}

    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="tpunb-bench-trainer-"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Stamp()])
    engine = FusionEngine(torch.device("cpu"))
    started = time.perf_counter()
    if fused:
        with engine.scope(FuseOptions(sync_compile=True)):
            trainer.train()
    else:
        trainer.train()
    total = time.perf_counter() - started
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "step_ms": statistics.median(gaps[len(gaps) // 2 :]),
        "total_s": total,
        "last_loss": losses[-1],
        "graphs": engine.stats()["graphs"],
        "hits": engine.stats()["hits"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="bert")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tpunb-bench-inductor-"))
    import torch

    torch.set_num_threads(args.threads)
    strict = run(args.model, args.size, args.steps, fused=False)
    fused = run(args.model, args.size, args.steps, fused=True)
    print(f"HF Trainer.train(), {args.model} {args.size}, {args.steps} steps, {args.threads} thread(s)")
    for name, row in (("strict", strict), ("fused", fused)):
        print(
            f"  {name:<6} steady step {row['step_ms']:7.2f} ms · whole run {row['total_s']:6.1f} s · "
            f"last logged loss {row['last_loss']:.4f} · graphs {row['graphs']} · hits {row['hits']}"
        )
    print(f"  fused / strict speed, once warm: {strict['step_ms'] / fused['step_ms']:.2f}x")


if __name__ == "__main__":
    main()
