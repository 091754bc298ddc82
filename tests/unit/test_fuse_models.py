"""Fused equals strict on real Hugging Face architectures (tiny configs, random weights, the
model suite's builders): training losses, final parameters and evaluation logits.

Three ways fused mode trains, each against strict mode:

* compiled whole (fused mode's default, hot training): the first calls are recorded, then the
  model's training call (forward and backward) and its optimizer's step run as Inductor
  compiled them; 12 architectures;
* the recorder replayed (``compile=False``): recording, the known path, adoption and the
  foreach optimizer are what differ from strict mode there; 15 architectures;
* the recorder's groups compiled (``--no-hot-training``), lifted bias corrections included;
  two architectures. The model suite (``python -m benchmarks.models``) checks every
  architecture compiled.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from benchmarks.hf_suite import build, loss_of
from tpunb.events import EventBus, GroupStatus
from tpunb.fuse import DeferredTensor, FuseOptions, FusionEngine
from tpunb.fuse.config import HOT_AFTER, HOT_STEPS_AFTER

REPLAY = FuseOptions(compile=False)
COMPILED = FuseOptions(sync_compile=True, hot_training=False)  # the recorder's groups, compiled
WHOLE = FuseOptions(sync_compile=True, hot_training=True)  # the model and its step compiled whole
STEPS = 4
#: Steps until both the training call and the optimizer's step have run compiled code: the
#: model turns hot at its HOT_AFTER-th call, its optimizer at the HOT_STEPS_AFTER-th step after.
WHOLE_STEPS = HOT_AFTER + HOT_STEPS_AFTER + 1

#: Encoders (FNet: Fourier transforms instead of attention), decoders, encoder-decoders and a
#: vision model: 15 architectures.
REPLAYED = [
    "bert",
    "albert",
    "distilbert",
    "roberta",
    "deberta-v2",
    "gpt2",
    "gpt-neo",
    "opt",
    "t5",
    "bart",
    "llama",
    "qwen3",
    "mistral",
    "vit",
    "fnet",
]
COMPILED_ARCHS = ["bert", "llama"]
#: Compiled whole: 12 of them, all but the three slowest to compile here (20-40 s more each).
COMPILED_WHOLE = [name for name in REPLAYED if name not in ("albert", "deberta-v2", "t5")]


def train(model, opt, inputs, engine: FusionEngine | None, options: FuseOptions, steps: int) -> list[float]:
    model.train()
    losses = []
    for _ in range(steps):
        scope = engine.scope(options, adopt=(model, opt)) if engine is not None else contextlib.nullcontext()
        with scope:
            loss = loss_of(model(**inputs), inputs)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def logits_of(model, inputs, engine: FusionEngine | None) -> torch.Tensor:
    model.eval()
    features = {k: v for k, v in inputs.items() if k not in ("labels", "start_positions", "end_positions")}
    with torch.no_grad():
        if engine is None:
            out = model(**features)
        else:
            with engine.scope(REPLAY):
                out = model(**features)
    logits = out["logits"] if "logits" in out else out["start_logits"]
    return logits.materialized() if isinstance(logits, DeferredTensor) else logits


def adamw(parameters) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-3)


def sgd(parameters) -> torch.optim.Optimizer:
    """For the backward compiled whole: Inductor sums a gradient in another order than eager,
    and AdamW turns an element's near-zero gradient into a learning-rate-sized step either way
    (seen: a DistilBERT layer norm bias, 6 steps); SGD moves it by the gradient's size."""
    return torch.optim.SGD(parameters, lr=1e-2, momentum=0.9)


def check_equal(
    name: str, options: FuseOptions, steps: int = STEPS, bus: EventBus | None = None, optimizer=adamw
) -> FusionEngine:
    strict_model, inputs = build(name, "tiny")
    fused_model = copy.deepcopy(strict_model)
    strict_opt = optimizer(strict_model.parameters())
    fused_opt = optimizer(fused_model.parameters())
    expected = train(strict_model, strict_opt, inputs, None, options, steps)
    engine = FusionEngine(torch.device("cpu"), bus.publish if bus is not None else None)
    got = train(fused_model, fused_opt, inputs, engine, options, steps)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=f"{name}: losses")
    # AdamW divides each gradient by its running scale: an element whose gradients are near zero
    # moves by about the learning rate either way, so a compiled kernel's other order of sums
    # can move it by 1e-5 (seen: 1 element of llama's 16384 down_proj weights, 1.6e-5)
    for (pname, ours), theirs in zip(fused_model.named_parameters(), strict_model.parameters(), strict=True):
        torch.testing.assert_close(
            ours.detach(), theirs.detach(), rtol=1e-4, atol=5e-5, msg=f"{name}: {pname}"
        )
    # trained weights within 1e-5 can move a logit near zero by a little more
    torch.testing.assert_close(
        logits_of(fused_model, inputs, engine), logits_of(strict_model, inputs, None), rtol=1e-4, atol=5e-5
    )
    return engine


@pytest.mark.parametrize("name", COMPILED_WHOLE)
def test_training_compiled_whole_equals_strict(name):
    bus = EventBus()
    check_equal(name, WHOLE, WHOLE_STEPS, bus, optimizer=sgd)
    rows = [g for g in bus.recent("group") if g.key.endswith(("-training", "-step"))]
    calls = {g.key.rsplit("-", 1)[1]: g for g in rows}
    assert set(calls) == {"training", "step"}, [g.key for g in rows]
    assert all(g.status is GroupStatus.HIT for g in calls.values()), [(g.key, g.status) for g in rows]


@pytest.mark.parametrize("name", REPLAYED)
def test_fused_training_and_logits_equal_strict(name):
    engine = check_equal(name, REPLAY)
    assert engine.groups >= STEPS  # forward, backward and update recorded, at least a group a step
    assert engine.counts["followed"] > engine.counts["recorded"]  # later steps followed the first


@pytest.mark.parametrize("name", COMPILED_ARCHS)
def test_compiled_fused_training_equals_strict(name):
    engine = check_equal(name, COMPILED)
    stats = engine.stats()
    assert stats["hits"] >= 1 and stats["failures"] == 0, stats
