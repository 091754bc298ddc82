"""The training loops the hardware suite runs in every mode: cells as a user writes them.

Each workload is two cells: ``build`` (strict: a seeded model, its optimizer and a batch on the
chip) and ``train`` (the loop, in the mode under test, leaving the per-step losses in
``losses``). Models are small (two layers, width 128) so that a cell's first compile takes
seconds; dropout is off so that every mode must give strict's losses step for step. The batch
repeats, so the loss must fall.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The batch every language model trains on: 4 sequences of 64 tokens from a 512-token vocabulary.
TOKENS = """
generator = torch.Generator().manual_seed(1)
ids = torch.randint(0, 512, (4, 64), generator=generator).to(DEVICE)
"""

GPT2 = """
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(config).to(DEVICE)
"""

LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=256, vocab_size=512, max_position_embeddings=128)
model = LlamaForCausalLM(config).to(DEVICE)
"""

#: Six steps; each keeps its loss as ``keep`` says (read at once by default).
LM_STEPS = """
{kept} = []
for step in range(6):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    {schedule}optimizer.zero_grad()
    {kept}.append({keep})
"""


def lm_steps(schedule: str = "", kept: str = "losses", keep: str = "loss.item()") -> str:
    return LM_STEPS.format(schedule=schedule, kept=kept, keep=keep)


@dataclass(frozen=True)
class Workload:
    name: str
    build: str
    train: str
    precisions: tuple[str, ...] = ("fp32", "bf16")


MLP = Workload(
    "mlp",
    build="""
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.mid = torch.nn.Linear(64, 256), torch.nn.Linear(256, 256)
        self.out = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.out(torch.nn.functional.gelu(self.mid(torch.nn.functional.gelu(self.up(x)))))

torch.manual_seed(0)
model = MLP().to(DEVICE)
x = torch.randn(64, 64).to(DEVICE)
y = torch.randint(0, 10, (64,)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
""",
    train="""
losses = []
for step in range(8):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    losses.append(loss.item())
""",
)

GPT2_ADAMW = Workload(
    "gpt2",
    build=GPT2 + TOKENS + "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n",
    train=lm_steps(),
)

#: GPT-2 with HF's default dropout (after the embeddings, each attention and MLP, and inside
#: attention), the random stream seeded in the loop's cell: every mode must draw strict's masks
#: and leave both generators where strict does (the chip's, and the CPU's, from which
#: AOTAutograd seeds a compiled graph's own generators when it keeps them).
GPT2_DROPOUT = Workload(
    "gpt2-dropout",
    build=GPT2.replace("resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0", "")
    + TOKENS
    + "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n",
    train="torch.manual_seed(5)\n"
    + lm_steps()
    + "drawn_next = torch.rand(3, device=DEVICE).cpu().tolist() + torch.rand(3).tolist()\n",
)

LLAMA_ADAM = Workload(
    "llama",
    build=LLAMA
    + TOKENS
    + "optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)\n"
    + "schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))\n",
    train=lm_steps(schedule="schedule.step()\n    "),
)

LORA = Workload(
    "lora",
    build=LLAMA
    + TOKENS
    + """
from peft import LoraConfig, get_peft_model
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
""",
    train=lm_steps(),
)

#: A loop that reads no value until it ends (each step's loss stays on the chip).
NO_READ = Workload(
    "no_read",
    build=GPT2 + TOKENS + "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n",
    train=lm_steps(kept="kept", keep="loss.detach()") + "losses = torch.stack(kept).cpu().tolist()\n",
)

#: Model, optimizer and schedule made inside the cell that trains them (compile mode aborted
#: the process on this before tpunb kept CPU tensors away from TorchTPU's compiler).
BUILT_IN_THE_CELL = Workload(
    "built_in_the_cell",
    build="",
    train=LLAMA
    + TOKENS
    + "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n"
    + "schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))\n"
    + lm_steps(schedule="schedule.step()\n    "),
    precisions=("fp32",),
)

#: Hugging Face's ``Trainer``: it makes its AdamW and linear schedule inside ``train()``, moves the
#: model to the device accelerate picks, clips gradients and logs each step's loss. Every epoch is
#: the four sequences (one batch, shuffled: the mean loss does not depend on the order).
TRAINER = Workload(
    "trainer",
    build=LLAMA
    + TOKENS
    + """
import tempfile
from transformers import Trainer, TrainingArguments

class Sequences(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return {"input_ids": self.rows[index], "labels": self.rows[index]}

arguments = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=6,
                              learning_rate=3e-3, logging_steps=1, report_to=[], save_strategy="no",
                              disable_tqdm=True, dataloader_pin_memory=False, seed=0)
trainer = Trainer(model=model, args=arguments, train_dataset=Sequences(ids.cpu()))
""",
    train="""
trainer.train()
losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
trained_on = next(model.parameters()).device.type
""",
    precisions=("fp32",),
)

WORKLOADS = (MLP, GPT2_ADAMW, LLAMA_ADAM, LORA, NO_READ, BUILT_IN_THE_CELL, TRAINER)

#: Greedy generation: the tokens every mode must produce as strict does.
GENERATE = """
prompt = ids[:1, :8]
with torch.no_grad():
    tokens = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0).cpu().tolist()
"""
