"""What tpunb sees on the chip: the runtime, the chips it can use, HBM figures the chip can hold,
the doctor's verdict, and no warning about code the user did not write."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from workloads import GPT2_ADAMW, LLAMA, TOKENS


def test_the_chip_is_found_and_counted_as_torchtpu_counts_it(cells) -> None:
    stats = cells.value("tpunb.stats()")
    assert (stats["runtime"], stats["device"]) == ("torchtpu", "tpu:0")
    cells.ok("from torch_tpu._internal.utils import hardware\nchips = hardware.get_tpu_device_count()")
    chips = cells.value("chips")
    assert f"{chips} TPU chip{'s' if chips != 1 else ''} found" in stats["runtime_reason"], stats


def test_hbm_figures_are_the_chips_own(cells) -> None:
    cells.ok("big = torch.ones(1024, 1024, 64, device=DEVICE)")  # 256 MiB
    memory = cells.value("tpunb.stats()['memory']")
    limit = cells.value("torch.accelerator.get_memory_info()[1]")
    assert memory["label"] == "HBM" and memory["limit"] == limit
    assert 256 * 2**20 <= memory["used"] <= memory["peak"] <= memory["limit"], memory
    cells.ok("del big")


def test_the_doctor_finds_nothing_wrong_here(cells) -> None:
    cells.ok("from tpunb.doctor import run_checks\nreport = run_checks()")
    checks = {check.name: check for check in cells.value("report.checks")}
    assert checks["libtpu for torch_tpu"].status == "ok", checks["libtpu for torch_tpu"]
    assert checks["TPU free"].status == "ok"  # this process holds the chip, no other
    assert "chip" in checks["TPU"].detail and checks["runtime"].detail.startswith(
        "a kernel would use torchtpu"
    )


def test_a_training_cell_warns_only_about_the_users_own_code(cells) -> None:
    """TorchTPU reads ``.grad`` inside each copy to the host: ``loss.item()`` warned about a
    non-leaf ``.grad`` at the user's line in every training cell."""
    cells.ok(GPT2_ADAMW.build)
    ran = cells.ok(GPT2_ADAMW.train)
    assert ".grad attribute" not in ran.warned, ran.warned
    own = cells.run("reading = loss.grad")
    assert ".grad attribute of a Tensor that is not a leaf" in own.warned, own.warned


def test_compiled_programs_are_kept_on_disk_for_the_next_kernel(cells) -> None:
    """tpunb names TorchTPU's tier-3 cache at ``%load_ext``, before the TPU's first use; a new
    shape compiled in this process lands there, where a kernel started later finds it."""
    directory = Path(cells.value("__import__('os').environ['TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT']"))
    before = {path for path in directory.rglob("*") if path.is_file()}
    width = 64 + time.time_ns() % 4096  # a shape no earlier run on this machine compiled
    cells.ok(f"odd = torch.randn(37, {width}, device=DEVICE)\nkept = float((odd @ odd.T).tanh().sum())")
    after = {path for path in directory.rglob("*") if path.is_file()}
    assert after - before, f"nothing new in {directory}"


#: Attention in each form HF passes it, forward and backward: on the CPU (``expected``, causal)
#: and on the chip (``attend`` in the cell under test), at full fp32 matmul precision.
ATTENTION = """
generator = torch.Generator().manual_seed(3)
q, k, v, weights = (torch.randn(2, 4, 16, 8, generator=generator) for _ in range(4))
causal = torch.ones(16, 16, dtype=torch.bool).tril().expand(2, 1, 16, 16)
additive = torch.zeros(2, 1, 16, 16).masked_fill(~causal, float("-inf"))

def attend(q, k, v, weights, **form):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **form)
    (out * weights).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]

expected = attend(q, k, v, weights, is_causal=True)
on_chip = [t.to(DEVICE) for t in (q, k, v, weights)]
forms = {"is_causal": {"is_causal": True}, "boolean mask": {"attn_mask": causal.to(DEVICE)},
         "additive mask": {"attn_mask": additive.to(DEVICE)}}
previous = torch.get_float32_matmul_precision()
torch.set_float32_matmul_precision("highest")
"""


@pytest.mark.parametrize("mode", ["strict", "compile"])
def test_attention_and_its_gradients_honour_an_explicit_mask_as_the_cpu_does(cells, mode: str) -> None:
    """HF passes scaled_dot_product_attention an explicit causal mask (B, 1, S, S) for padded
    batches and where Dynamo traces a model without its cache, ``is_causal=True`` otherwise.
    Each form, op by op and compiled for the chip, gives the CPU's causal output and gradients
    (a compile cell hands the compiled attention HF's mask as an input: see the next test)."""
    cells.ok(ATTENTION)
    ran = cells.run(
        f"%%tpu_mode {mode}\nresults = {{n: attend(*on_chip, **form) for n, form in forms.items()}}"
    )
    cells.ok("torch.set_float32_matmul_precision(previous)")
    assert ran.error is None, ran.output
    gaps = cells.value(
        "{n: [float((a.cpu() - b).abs().max()) for a, b in zip(got, expected)] for n, got in results.items()}"
    )
    assert all(gap < 1e-3 for row in gaps.values() for gap in row), f"(output, dq, dk, dv) gaps: {gaps}"


def test_a_compiled_model_without_its_cache_gives_strict_logits(cells) -> None:
    """A Llama forward with ``use_cache=False`` (as HF's Trainer runs it: HF's explicit mask
    under Dynamo) compiled for the chip gives strict's logits at full fp32 precision. Compiled
    whole, with the mask built inside the graph, they were off by 1.6x their largest on a v5e
    (torch_tpu 0.2.0), and HF's Trainer trained wrongly in a compile cell."""
    highest = 'previous = torch.get_float32_matmul_precision()\ntorch.set_float32_matmul_precision("highest")'
    cells.ok(LLAMA + TOKENS + highest)
    forward = "with torch.no_grad():\n    logits = model(input_ids=ids, use_cache=False).logits.cpu()\n"
    cells.ok(forward + "strict_logits = logits")
    ran = cells.run("%%tpu_mode compile\n" + forward)
    cells.ok("torch.set_float32_matmul_precision(previous)")
    assert ran.error is None, ran.output
    gap = cells.value("float((logits - strict_logits).abs().max() / strict_logits.abs().max())")
    assert gap < 1e-3, f"compiled logits differ from strict's by {gap:.3g} of their largest"


def test_gpt2_keeps_its_tied_weights_and_trains_as_on_the_cpu(cells) -> None:
    """``model.to(DEVICE)`` made new parameters on TorchTPU, untying GPT-2's output layer from its
    token embedding: strict's losses on the chip were an untied model's (5.4389 at step 2, the
    CPU's 5.4714). The model trained on the CPU and on the chip, at full fp32 matmul precision,
    gives the same losses."""
    cells.ok(
        """
from transformers import GPT2Config, GPT2LMHeadModel
previous = torch.get_float32_matmul_precision()
torch.set_float32_matmul_precision("highest")
def three_steps(device):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(device)
    tied = model.lm_head.weight is model.transformer.wte.weight
    tokens = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return tied, losses
try:
    on_cpu, on_chip = three_steps("cpu"), three_steps(DEVICE)
finally:
    torch.set_float32_matmul_precision(previous)
"""
    )
    (cpu_tied, cpu_losses), (chip_tied, chip_losses) = cells.value("on_cpu"), cells.value("on_chip")
    assert cpu_tied and chip_tied
    assert all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(chip_losses, cpu_losses, strict=True)), (
        chip_losses,
        cpu_losses,
    )
