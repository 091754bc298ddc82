"""Language-model training on a TPU chip, per tpunb mode and precision, through notebook cells.

    python -m benchmarks.tpu [--models gpt2,llama,bert] [--precisions bf16,fp32]
                             [--modes strict,fused,compile] [--loops reads,no-read]
                             [--steps 10] [--jax] [--chain] [--json PATH]

Runs on a machine with a TPU chip and torch_tpu (README: Testing on a TPU). Each model is
built from a config with random weights (gpt2: HF GPT-2 with 6 layers, width 768, about 120 M
parameters; llama: a Llama of the same width and depth, 32k vocabulary; bert: a BERT of the
same width and depth classifying the batch's 8 sequences into two classes), trained with AdamW
on one batch of 8 x 512 tokens repeated, in cells as a notebook runs them (in this process's
IPython with tpunb loaded: the machine has no TCP for a kernel). Per model, precision and mode:

* **first s**: the training cell's first run, with every compile it waited for;
* **tok/s** and **MFU**: the same cell run again (warm), tokens over its seconds; MFU counts 6
  FLOPs per token per weight used in a matrix product against the chip's bf16 peak
  (TorchTPU's table: 197 TFLOP/s for a v5e);
* **loss diff**: the largest relative difference from strict's losses at any step of the first
  runs (both from the same seeded weights), and whether the loss fell.

Ratios are against strict in the same run, same model, loop and precision. On a v5e,
``--models gpt2 --steps 5`` (both precisions, three modes) took 231 s, most of it compile mode's
first runs (67-81 s each): where a command is limited to 10 minutes, run one model a command.
`--loops no-read` keeps each step's loss on the device and reads them after the loop (a loop that
reads no value between steps). A fused cell compiles a trained model whole only once its steps
have taken 30 s (tpunb/runtimes/torchtpu_fused.py); ``--modes "strict,fused,fused --sync-compile"``
adds a row where it is compiled from its second step, the call waiting for the compile.
``--jax`` adds the reference row for GPT-2's shape in bf16: the same model trained in plain JAX
in this process (benchmarks/tpu_jax.py; the chip's own JAX), what leaving PyTorch would give.
``--chain`` adds the elementwise chain (1,500 ops at a cell's top level), per mode, its "tok/s"
column counting elements a second. Each row prints its first run's steps in one line (the first,
the slowest after it, the medians of each half: where a capture stalled a step, when the swap
came), and ``--json`` keeps every step's seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, SEQUENCE = 8, 512

MODELS = {
    "gpt2": """
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)).to(DEVICE)
""",
    "llama": """
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(num_hidden_layers=6, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                     intermediate_size=2048, vocab_size=32000, max_position_embeddings=1024)
model = LlamaForCausalLM(config).to(DEVICE)
""",
    "bert": """
from transformers import BertConfig, BertForSequenceClassification
torch.manual_seed(0)
config = BertConfig(num_hidden_layers=6, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                    max_position_embeddings=512, num_labels=2)
model = BertForSequenceClassification(config).to(DEVICE)
""",
}
#: What each model is trained to predict: the next token, or one class per sequence.
LABELS = {
    "gpt2": "ids",
    "llama": "ids",
    "bert": f"torch.randint(0, 2, ({BATCH},), generator=generator).to(DEVICE)",
}

SETUP = f"""
generator = torch.Generator().manual_seed(1)
ids = torch.randint(0, model.config.vocab_size, ({BATCH}, {SEQUENCE}), generator=generator).to(DEVICE)
labels = {{labels}}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
embeddings = {{{{id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}}}}
head = model.get_output_embeddings()
matmul_weights = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
matmul_weights += head.weight.numel() if head is not None and id(head.weight) in embeddings else 0
"""

TRAIN = """
import time
losses, step_ends = [], [time.perf_counter()]
for step in range({{steps}}):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append({kept})
    step_ends.append(time.perf_counter())
{after}"""

#: Each step's loss read at once, or kept on the device until the loop ends (TorchTPU's
#: DEFER_AND_FUSE grew one deferred graph across such steps: 0.1x strict on GPT-2 before fused
#: cells cut it at each step).
LOOPS = {
    "reads": TRAIN.format(kept="loss.item()", after=""),
    "no-read": TRAIN.format(kept="loss.detach()", after="losses = [float(loss) for loss in losses]\n"),
}


@dataclass
class Row:
    model: str
    loop: str
    precision: str
    mode: str
    first_s: float
    tokens_per_s: float
    mfu: float
    loss_diff: float
    loss_fell: bool | None  # None: no loss (the chain)
    error: str | None = None
    #: the first and the warm run's summary lines (what compiled, what waited), for --json
    summaries: tuple[str | None, ...] = ()
    #: the first run's seconds per step (where a "reads" loop's first run spent its time)
    first_steps: list[float] = field(default_factory=list)
    #: the warm run's (where a compile that outlasted the first run swapped in)
    warm_steps: list[float] = field(default_factory=list)


def steps_in_words(seconds: list[float]) -> str:
    """A first run's steps, in one line: its first step, the slowest after it, the median of the
    first and of the last half, so that a compile's stall and its swap show."""
    if len(seconds) < 4:
        return "steps: " + ", ".join(f"{s:.3f}" for s in seconds) + " s"
    half = len(seconds) // 2
    rest = seconds[1:]
    slowest = max(range(len(rest)), key=rest.__getitem__) + 1
    return (
        f"steps: first {seconds[0]:.2f} s, slowest after it {seconds[slowest]:.2f} s (step {slowest}), "
        f"median {statistics.median(seconds[:half]) * 1e3:.0f} ms in the first half, "
        f"{statistics.median(seconds[half:]) * 1e3:.0f} ms in the second"
    )


def failed_row(model: str, loop: str, precision: str, mode: str, first) -> Row:
    """A mode whose first run failed: its seconds and its error."""
    return Row(model, loop, precision, mode, first.seconds, 0.0, 0.0, float("nan"), False, repr(first.error))


def measure(
    cells, model: str, loop: str, precision: str, mode: str, steps: int, strict: list[float] | None
) -> tuple[Row, list[float]]:
    """One mode's row, and its first run's losses (strict's are the others' reference)."""
    cells.ok(MODELS[model] + SETUP.format(labels=LABELS[model]))
    train = f"%%tpu_precision {precision}\n%%tpu_mode {mode}\n" + LOOPS[loop].format(steps=steps)
    first = cells.run(train)
    if first.error is not None:
        cells.run("del model, optimizer")
        return failed_row(model, loop, precision, mode, first), []
    losses = [float(x) for x in cells.value("losses")]
    first_steps = step_seconds(cells)
    warm = cells.run(train)
    warm_steps = step_seconds(cells)
    tokens_per_s = steps * BATCH * SEQUENCE / warm.seconds
    flops = 6 * cells.value("matmul_weights") * tokens_per_s
    reference = strict or losses
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
    cells.ok("del model, optimizer")
    fell = losses[-1] < losses[0]
    mfu = flops / peak_flops()
    row = Row(model, loop, precision, mode, first.seconds, tokens_per_s, mfu, diff, fell)
    row.summaries = (first.summary, warm.summary)
    row.first_steps = first_steps
    row.warm_steps = warm_steps
    return row, losses


def step_seconds(cells) -> list[float]:
    """The seconds of each step of the training cell's last run."""
    return [b - a for a, b in itertools.pairwise(cells.value("step_ends"))]


#: The elementwise chain (the research note's): 1,500 ops on 256 x 1024 at the cell's top level,
#: no module call, one value read at the end. Its rows' "tok/s" column is elements a second.
CHAIN_INPUT = "chain_x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0)).to(DEVICE)"
CHAIN = """
y = chain_x
for i in range(1000):
    y = y * 1.0001 + 0.0001 if i % 2 else torch.tanh(y)
chain_sum = y.sum().item()
"""


def chain_rows(cells, modes: list[str]) -> list[Row]:
    """The elementwise chain's first and warm runs per mode; "loss diff" is the relative gap of its
    sum to strict's."""
    cells.ok(CHAIN_INPUT)
    rows, reference = [], None
    for mode in modes:
        first = cells.run(f"%%tpu_mode {mode}\n{CHAIN}")
        if first.error is not None:
            rows.append(failed_row("chain", "-", "fp32", mode, first))
            continue
        value = cells.value("chain_sum")
        reference = value if reference is None else reference
        warm = cells.run(f"%%tpu_mode {mode}\n{CHAIN}")
        diff = abs(value - reference) / abs(reference)
        rows.append(
            Row("chain", "-", "fp32", mode, first.seconds, 256 * 1024 / warm.seconds, 0.0, diff, None)
        )
    return rows


def jax_row(loop: str, steps: int) -> Row:
    """Plain JAX's row for GPT-2's shape in bf16 (its losses start from other weights, so they are
    not compared with strict's: only whether they fell)."""
    from benchmarks.tpu_jax import Shape, measure

    shape = Shape(batch=BATCH, sequence=SEQUENCE)
    done = measure(shape, steps)
    mfu = 6 * shape.matmul_weights * done.tokens_per_s / peak_flops()
    fell = done.losses[-1] < done.losses[0]
    nan = float("nan")
    return Row("gpt2", loop, "bf16", "jax reference", done.first_s, done.tokens_per_s, mfu, nan, fell)


def peak_flops() -> float:
    """The chip's bf16 peak, from TorchTPU's table of generations."""
    from torch_tpu._internal.utils import hardware

    return float(hardware.get_bf16_flops_per_device())


def table(rows: list[Row]) -> str:
    strict = {(r.model, r.loop, r.precision): r.tokens_per_s for r in rows if r.mode == "strict"}
    lines = [
        f"{'model':<6} {'loop':<7} {'prec':<5} {'mode':<21} {'first s':>8} {'tok/s':>9} {'x strict':>8} "
        f"{'MFU':>6} {'loss diff':>9} fell"
    ]
    for r in rows:
        baseline = strict.get((r.model, r.loop, r.precision))
        ratio = r.tokens_per_s / baseline if baseline else 0.0
        lines.append(
            f"{r.model:<6} {r.loop:<7} {r.precision:<5} {r.mode:<21} {r.first_s:>8.1f} "
            f"{r.tokens_per_s:>9.0f} {ratio:>7.2f}x {r.mfu:>6.1%} {r.loss_diff:>9.1e} "
            f"{'-' if r.loss_fell is None else 'yes' if r.loss_fell else 'NO'}"
            + (f"  {r.error[:120]}" if r.error else "")
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--modes", default="strict,fused,compile")
    parser.add_argument("--loops", default="reads", help="reads (loss.item() each step), no-read, or both")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--jax", action="store_true", help="add plain JAX's row for GPT-2's shape (bf16)")
    parser.add_argument("--chain", action="store_true", help="add the elementwise chain's rows (per mode)")
    parser.add_argument("--json", default=None, help="also write the rows here as JSON")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "tpu"))
    from cells import Cells

    cells = Cells()
    cells.ok("import torch, tpunb\nDEVICE = tpunb.device()")
    rows = []
    modes = ["strict", *(m for m in args.modes.split(",") if m != "strict")]
    if args.chain:
        for row in chain_rows(cells, modes):
            rows.append(row)
            print(table(rows).splitlines()[-1], flush=True)
    for model, loop, precision in itertools.product(
        [m for m in args.models.split(",") if m], args.loops.split(","), args.precisions.split(",")
    ):
        strict: list[float] | None = None
        for mode in modes:
            row, losses = measure(cells, model, loop, precision, mode, args.steps, strict)
            if mode == "strict":
                strict = losses or None
            rows.append(row)
            print(table(rows).splitlines()[-1], flush=True)
            runs = (("first", row.first_steps), ("warm", row.warm_steps))
            said = [*row.summaries, *(f"{run} run's {steps_in_words(s)}" for run, s in runs if s)]
            for line in said:
                print(f"{'':8}{line}", flush=True)
        if args.jax and model == "gpt2" and precision == "bf16":
            rows.append(jax_row(loop, args.steps))
            print(table(rows).splitlines()[-1], flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
