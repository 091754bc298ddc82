"""HF ``Trainer.train()`` in a fused cell of a real kernel, with the logged losses equal to
strict mode's. By default the model the Trainer makes inside ``train()`` turns hot: its calls
run compiled whole and hit once compiled. With every training call recorded
(``--no-hot-training``), the model and the optimizer are adopted as they first run, each step
is one group that repeats (the LR schedule and Adam's bias corrections lifted), and the groups
hit the cache once compiled."""

from __future__ import annotations

import pytest

SETUP = """
import os, tempfile
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 500, (48, 16), generator=g)
        self.labels = torch.randint(0, 2, (48,), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}

data = Tokens()  # tokenised in a strict cell, as notebooks do

def train():
    # everything made inside the function: nothing in the namespace to adopt up front
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                        vocab_size=500, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=20,
                             logging_steps=10, report_to=[], save_strategy="no", use_cpu=True,
                             disable_tqdm=True, seed=0)
    global last_trainer
    last_trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=data)
    last_trainer.train()
    trainer = last_trainer
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
"""


def test_trainer_train_in_a_fused_cell_compiles_the_model_whole(kernel):
    assert kernel.run(SETUP, timeout=300).error is None
    assert kernel.run("expected = train()", timeout=300).error is None
    fused = kernel.run("%%tpu_mode fused --sync-compile\nlosses = train()", timeout=600)
    assert fused.error is None, fused.error
    assert kernel.value("losses") == pytest.approx(kernel.value("expected"), rel=1e-5)
    groups = kernel.value("tpunb.stats()['groups']")
    calls = [g for g in groups if g["key"] == "BertForSequenceClassification-training"]
    assert len(calls) >= 16, [g["trigger"] for g in groups]  # from the model's 3rd call or so
    assert calls[0]["status"] == "miss" and {g["status"] for g in calls[1:]} == {"hit"}, calls
    # the Trainer's CPU AdamW is fused=True: PyTorch's own fused kernel steps it (hotsteps.py)
    assert not [g for g in groups if g["key"].endswith("-step")]


def test_trainer_train_in_a_fused_cell_with_every_call_recorded_fuses_each_step(kernel):
    assert kernel.run(SETUP, timeout=300).error is None
    strict = kernel.run("expected = train()", timeout=300)
    assert strict.error is None, strict.error
    before = kernel.value("len(tpunb.stats()['groups'])")
    fused = kernel.run("%%tpu_mode fused --sync-compile --no-hot-training\nlosses = train()", timeout=600)
    assert fused.error is None, fused.error
    assert kernel.value("losses") == pytest.approx(kernel.value("expected"), rel=1e-5)
    groups = kernel.value("tpunb.stats()['groups']")[before:]
    steps = [g for g in groups if g["trigger"].startswith((".item()", "if tensor / bool()"))]
    # one group a step (the NaN check on each step's loss, an `if` on a tensor, ends it), plus
    # the logging reads
    assert 20 <= len(steps) <= 20 + 2 + 1, [g["trigger"] for g in groups]
    # adopted as they first ran: the model's parameters and the optimizer's state
    adopted = "[type(t).__name__ for t in (next(last_trainer.model.parameters()), {})]"
    state = "next(iter(last_trainer.optimizer.state.values()))['exp_avg']"
    assert kernel.value(adopted.format(state)) == ["DeferredTensor", "DeferredTensor"]
    statuses = [g["status"] for g in steps]
    # warm: the steady step hits its compiled group
    described = [(g["status"], g["ops"], g["lifted"], g["miss_reason"]) for g in steps]
    assert statuses[-6:].count("hit") >= 5, described
    assert max(g["lifted"] for g in steps) > 0  # the schedule's LR and the bias corrections ride as inputs
