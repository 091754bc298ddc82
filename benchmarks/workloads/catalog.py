"""The workloads: training loops others wrote, from registry packages, as a user drives them.

Each workload is the code a user would put in two cells: a set-up cell (seed, a small model
built with the package's own API, generated data, the package's trainer) and a training cell
that calls the package's entry point (``trainer.train()``, ``trainer.fit(...)``,
``model.fit(...)``). The set-up logs each step's loss with ``record(loss)`` (defined by the
harness) from the package's own hook for it (a callback, an event handler), as a user logs a
loss curve. Models are built from constructors with random weights and data is generated:
nothing is downloaded. ``STEPS`` and ``DEVICE`` are set by the harness before the set-up runs.

On PyTorch/XLA (``DEVICE == "xla"``, workloads with ``on_xla``) the package's own XLA path
runs (the Trainer's and Accelerate's device choice, ``device=`` arguments) and dropout is
off: PyTorch/XLA draws other dropout masks op by op (eager, strict mode) than in a traced
graph (lazy, fused mode), without tpunb (measured on torch_xla 2.9: 4 of 8 elements differ),
so with dropout the modes cannot agree there.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """One package's training loop."""

    name: str
    packages: tuple[str, ...]  # the distributions it needs (pyproject's `workloads` extra)
    modules: tuple[str, ...]  # what must import for it to run
    setup: str  # the set-up cell
    train: str  # the training cell
    draws_between_steps: bool  # random numbers drawn between steps (shuffling, random batches)
    dropout: bool
    steps: int = 8
    on_xla: bool = False  # its set-up puts it on DEVICE, the XLA device on PyTorch/XLA


def missing_packages(workload: Workload) -> list[str]:
    return [m for m in workload.modules if importlib.util.find_spec(m) is None]


HF_TRAINER = Workload(
    name="hf_trainer",
    packages=("transformers",),
    modules=("transformers",),
    setup="""
import tempfile, torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
transformers.set_seed(0)
p = 0.1 if DEVICE == "cpu" else 0.0  # GPT-2's default dropout (off on XLA: the module docstring)
model = GPT2LMHeadModel(GPT2Config(
    n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=32, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
))

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 512, (256, 32))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

class LogLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            record(logs["loss"])

args = TrainingArguments(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=STEPS, logging_steps=1,
    learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=DEVICE == "cpu", disable_tqdm=True, seed=0,
    dataloader_num_workers=0,
    # the Trainer's default, fused AdamW, has no XLA kernel: users on a TPU pick the plain one
    optim="adamw_torch_fused" if DEVICE == "cpu" else "adamw_torch",
)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[LogLoss()])
""",
    train="trainer.train()",
    draws_between_steps=True,  # the Trainer's RandomSampler
    dropout=True,  # GPT-2's residual, embedding and attention dropout (0.1)
    on_xla=True,  # the Trainer picks the XLA device itself when torch_xla is installed
)

ACCELERATE = Workload(
    name="accelerate",
    packages=("accelerate",),
    modules=("accelerate",),
    setup="""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
set_seed(0)
accelerator = Accelerator(cpu=DEVICE == "cpu")
x = torch.randn(64, 12)
y = x @ torch.randn(12, 1) / 3 + 0.1 * torch.randn(64, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
p = 0.1 if DEVICE == "cpu" else 0.0  # (off on XLA: the module docstring)
model = nn.Sequential(nn.Linear(12, 48), nn.GELU(), nn.Dropout(p), nn.Linear(48, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
""",
    train="""
model.train()
for epoch in range(STEPS // 4):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        record(loss.item())
""",
    draws_between_steps=True,  # the prepared DataLoader shuffles every epoch
    dropout=True,
    on_xla=True,  # Accelerate's XLA path: its device, loader and optimizer step
)

LIGHTNING = Workload(
    name="lightning",
    packages=("lightning",),
    modules=("lightning",),
    setup="""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import lightning as L

class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Dropout(0.25), nn.Linear(64, 4))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)

class LogLoss(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        record(outputs["loss"].item())

L.seed_everything(0, verbose=False)
x, y = torch.randn(96, 20), torch.randint(0, 4, (96,))
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = Classifier()
trainer = L.Trainer(
    max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, callbacks=[LogLoss()],
)
""",
    train="trainer.fit(model, train_dataloaders=loader)",
    draws_between_steps=True,
    dropout=True,
)

KERAS = Workload(
    name="keras",
    packages=("keras",),
    modules=("keras",),
    setup="""
import os
os.environ["KERAS_BACKEND"] = "torch"
import keras, numpy as np

class LogLoss(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        record(logs["loss"])  # Keras logs the epoch's running mean

keras.utils.set_random_seed(0)
features = np.random.default_rng(0).standard_normal((64, 10)).astype("float32")
labels = (features[:, 0] * features[:, 1] > 0).astype("int64")
model = keras.Sequential([
    keras.Input(shape=(10,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dropout(0.3),
    keras.layers.Dense(2),
])
model.compile(
    optimizer=keras.optimizers.Adam(1e-2),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    jit_compile=False,
)
""",
    train=(
        "model.fit(features, labels, batch_size=16, epochs=STEPS // 4, shuffle=True, verbose=0,"
        " callbacks=[LogLoss()])"
    ),
    draws_between_steps=True,  # numpy shuffles the rows; the dropout masks come from torch's generator
    dropout=True,
)

SKORCH = Workload(
    name="skorch",
    packages=("skorch",),
    modules=("skorch",),
    setup="""
import numpy as np, torch
from torch import nn
from skorch import NeuralNetClassifier
from skorch.callbacks import Callback

class LogLoss(Callback):
    def on_batch_end(self, net, batch=None, training=None, loss=None, **kwargs):
        if training:
            record(loss.item())

torch.manual_seed(0)
X = torch.randn(80, 16)
y = torch.bucketize(X[:, :4].sum(1), torch.tensor([-1.0, 1.0]))
net = NeuralNetClassifier(
    nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 3)),
    criterion=nn.CrossEntropyLoss, optimizer=torch.optim.SGD, lr=0.05, optimizer__momentum=0.9,
    max_epochs=STEPS // 4, batch_size=20, train_split=None, iterator_train__shuffle=True,
    device="cpu", verbose=0, callbacks=[LogLoss()],
)
X, y = X.numpy(), y.numpy()
""",
    train="net.fit(X, y)",
    draws_between_steps=True,
    dropout=True,
)

IGNITE = Workload(
    name="ignite",
    packages=("pytorch-ignite",),
    modules=("ignite",),
    setup="""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from ignite.engine import Events, create_supervised_trainer
from ignite.utils import manual_seed
manual_seed(0)
x = torch.randn(64, 16)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
p = 0.2 if DEVICE == "cpu" else 0.0  # (off on XLA: the module docstring)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 2)).to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
trainer = create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss(), device=DEVICE)
trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda engine: record(engine.state.output))
""",
    train="trainer.run(loader, max_epochs=STEPS // 4)",
    draws_between_steps=True,
    dropout=True,
    on_xla=True,  # ignite's XLA path (xm.optimizer_step)
)

#: litgpt's GPT (two small layers) and its data, random token sequences of fixed strides: the
#: set-up both litgpt loops share.
LITGPT_MODEL = """
import torch
import lightning as L
from litgpt import GPT, Config
L.seed_everything(0, verbose=False)
config = Config.from_name(
    "pythia-14m", n_layer=2, n_embd=64, n_head=4, block_size=64, vocab_size=256, padded_vocab_size=256
)
model = GPT(config)

def get_batch():
    start = torch.randint(0, 256, (4, 1))
    tokens = (start + torch.arange(33) * torch.randint(1, 4, (4, 1))) % 256
    return tokens[:, :-1], tokens[:, 1:]
"""


def litgpt_loop(name: str, setup: str, train: str) -> Workload:
    """A loop on litgpt's model (``LITGPT_MODEL``, then ``setup``): a new random batch every
    step, no dropout."""
    return Workload(
        name=name,
        packages=("litgpt",),
        modules=("litgpt",),
        setup=LITGPT_MODEL + setup,
        train=train,
        draws_between_steps=True,
        dropout=False,
    )


LITGPT = litgpt_loop(
    "litgpt",
    setup="""
from litgpt.utils import chunked_cross_entropy
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
""",
    train="""
model.train()
for step in range(STEPS):
    x, y = get_batch()
    logits = model(x)
    loss = chunked_cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    record(loss.item())
""",
)

#: The loop as minimal GPT repositories (nanoGPT's train.py and its followers) write it, on
#: litgpt's model: AdamW over decay and no-decay groups, the learning rate (warm-up, then a
#: cosine) set by hand in every step's param groups, gradient clipping, the loss logged every
#: step, an evaluation every few steps under no_grad and eval(), back to train() after. The
#: evaluation's loss is logged too (compared with strict's like the others).
GPT_LOOP = litgpt_loop(
    "gpt_loop",
    setup="""
import math

def configure_optimizers(model, weight_decay, learning_rate, betas):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

def get_lr(step, max_lr=3e-3, warmup=2, total=STEPS):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    return 0.1 * max_lr + 0.45 * max_lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

@torch.no_grad()
def estimate_loss(batches=2):
    model.eval()
    losses = [torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) for x, y in
              (get_batch() for _ in range(batches))]
    model.train()
    return torch.stack(losses).mean().item()

optimizer = configure_optimizers(model, weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
""",
    train="""
model.train()
for step in range(STEPS):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(step)
    if step % 4 == 3:
        record(estimate_loss())
    x, y = get_batch()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    record(loss.item())
""",
)

PEFT_LORA = Workload(
    name="peft_lora",
    packages=("peft", "transformers"),
    modules=("peft", "transformers"),
    setup="""
import torch, transformers
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification
transformers.set_seed(0)
p = 0.1 if DEVICE == "cpu" else 0.0  # BERT's default dropout (off on XLA: the module docstring)
base = BertForSequenceClassification(BertConfig(
    vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=64, num_labels=3, hidden_dropout_prob=p, attention_probs_dropout_prob=p,
))
lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=p, target_modules=["query", "value"])
model = get_peft_model(base, lora).to(DEVICE)
ids, labels = torch.randint(0, 512, (64, 24)), torch.randint(0, 3, (64,))
loader = DataLoader(TensorDataset(ids, labels), batch_size=16, shuffle=True)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
""",
    train="""
model.train()
for epoch in range(STEPS // 4):
    for batch_ids, batch_labels in loader:
        loss = model(input_ids=batch_ids.to(DEVICE), labels=batch_labels.to(DEVICE)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        record(loss.item())
""",
    draws_between_steps=True,
    dropout=True,  # LoRA's dropout and BERT's own (0.1)
    on_xla=True,
)

WORKLOADS = {
    w.name: w for w in (HF_TRAINER, ACCELERATE, LIGHTNING, KERAS, SKORCH, IGNITE, LITGPT, GPT_LOOP, PEFT_LORA)
}
