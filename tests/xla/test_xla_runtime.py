"""tpunb's modes on real torch_xla (CPU PJRT device), observed through torch_xla's counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tpunb_kernels import Kernel, start_kernel
from xla_kernels import start_xla_kernel

#: TorchTPU's canonical chain, 150 elementwise ops.
CHAIN = "y = x\nfor _ in range(50):\n    y = y + 1\n    y = y * 2\n    y = y - 1\n"


def last_cell(kernel: Kernel) -> dict:
    return kernel.value("tpunb.stats()['last_cell']")


def test_fused_chain_is_one_graph(xla_kernel: Kernel) -> None:
    result = xla_kernel.run("%%tpu_mode fused\nx = torch.randn(64, 64, device='xla')\n" + CHAIN)
    assert result.error is None, result.error
    cell = last_cell(xla_kernel)
    assert cell["counters"]["graphs executed"] == 1
    assert cell["counters"]["IR nodes traced"] > 150  # the whole chain went into that graph
    assert cell["groups"] == 1 and "1 group" in result.stdout
    group = xla_kernel.value("tpunb.stats()['groups'][-1]")
    assert group["trigger"] == "cell end" and group["ops"] > 150 and len(group["key"]) == 12
    # the values are right: the chain maps v to 2**50 * (v + 1) - 1
    check = "float(((y + 1) / 2**50 - 1 - x).abs().max().cpu())"
    assert xla_kernel.value(check) < 1e-3


def test_fused_rerun_hits_the_cache(xla_kernel: Kernel) -> None:
    code = "%%tpu_mode fused\nr = torch.ones(32, 32, device='xla')\nfor _ in range(20):\n    r = r * 1.5\n"
    assert xla_kernel.run(code).error is None
    assert xla_kernel.run(code).error is None
    cell = last_cell(xla_kernel)
    assert cell["cache_hits"] == 1 and cell["cache_misses"] == 0
    assert xla_kernel.value("tpunb.stats()['groups'][-1]['status']") == "hit"


def test_value_read_inside_a_fused_cell_is_its_own_group_at_the_users_line(xla_kernel: Kernel) -> None:
    code = "%%tpu_mode fused\na = torch.arange(6.0, device='xla') * 3\ntotal = a.sum().item()\nb = a + total"
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    cell = last_cell(xla_kernel)["cell"]
    groups = xla_kernel.value("tpunb.stats()['groups'][-2:]")
    assert [g["trigger"] for g in groups] == [f"value read at Cell In[{cell}], line 3", "cell end"]
    assert xla_kernel.value("b.cpu().tolist()") == [45.0, 48.0, 51.0, 54.0, 57.0, 60.0]


#: A decoder step with a static KV cache written in place at a tensor position, and a
#: stopping check that reads a value every token, as HF generate() has.
DECODE = """
torch.manual_seed(0)
VOCAB, DIM, MAX_LEN = 64, 32, 24
emb = torch.nn.Embedding(VOCAB, DIM).to("xla")
wq, wk, wv = (torch.nn.Linear(DIM, DIM).to("xla") for _ in range(3))
head = torch.nn.Linear(DIM, VOCAB).to("xla")


def decode(steps):
    k_cache = torch.zeros(1, MAX_LEN, DIM, device="xla")
    v_cache = torch.zeros(1, MAX_LEN, DIM, device="xla")
    token, position = torch.tensor([[1]], device="xla"), torch.tensor([0], device="xla")
    positions = torch.arange(MAX_LEN, device="xla")
    tokens = []
    with torch.no_grad():
        for _ in range(steps):
            h = emb(token)
            k_cache.index_copy_(1, position, wk(h))
            v_cache.index_copy_(1, position, wv(h))
            scores = (wq(h) @ k_cache.transpose(1, 2)).masked_fill(positions > position, float("-inf"))
            token = head(scores.softmax(-1) @ v_cache)[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            position = position + 1
            if bool((token == VOCAB).all()):  # never true: the read every step is the point
                break
    return torch.cat(tokens, 1).cpu()
"""


@pytest.mark.parametrize("mode", ["fused", "compile"])
def test_decoding_with_a_static_cache_compiles_one_step_graph(xla_kernel: Kernel, mode: str) -> None:
    """A value read runs everything pending (xla_value_reads.py): every step is the same graph.
    torch_xla alone runs only what the read needs, and each step's graph then carries the
    cache writes of all the steps before it: a compile per token (compile mode's
    ``torch_xla.compile`` of the cell did that: 17 graphs for 16 steps of a PEFT loop)."""
    assert xla_kernel.run(DECODE).error is None
    assert xla_kernel.run("%%tpu_mode strict\nexpected = decode(16)").error is None
    result = xla_kernel.run(f"%%tpu_mode {mode}\ntokens = decode(16)")
    assert result.error is None, result.error
    assert last_cell(xla_kernel)["counters"].get("graphs compiled", 0) <= 3  # first step, the others, the cat
    assert xla_kernel.value("torch.equal(tokens, expected)") is True
    triggers = [g["trigger"] for g in xla_kernel.value("tpunb.stats()['groups'][-16:]")]
    assert all(trigger.startswith("value read at ") for trigger in triggers[:-1]), triggers
    assert xla_kernel.run(f"%%tpu_mode {mode}\ntokens = decode(16)").error is None
    assert last_cell(xla_kernel)["counters"].get("graphs compiled", 0) == 0  # the same graphs again
    assert xla_kernel.value("torch.equal(tokens, expected)") is True


def test_strict_runs_one_cached_graph_per_op(xla_kernel: Kernel) -> None:
    assert xla_kernel.run("xs = torch.randn(16, 16, device='xla')").error is None
    result = xla_kernel.run("%%tpu_mode strict\n" + CHAIN.replace("x\n", "xs\n", 1))
    assert result.error is None, result.error
    counters = last_cell(xla_kernel)["counters"]
    assert counters["graphs executed"] == 150
    assert counters.get("compile cache hits", 0) >= 147  # add, mul and sub compile at most once each
    assert xla_kernel.value("tpunb.stats()['groups'][-1]['trigger']") != "strict"  # no new group
    assert last_cell(xla_kernel)["groups"] == 0


def test_debug_catches_a_nan_at_the_users_line(xla_kernel: Kernel) -> None:
    code = "%%tpu_mode debug\nq = torch.tensor([1.0, -1.0], device='xla')\nok = q * 2\nbad = torch.sqrt(q)\n"
    result = xla_kernel.run(code)
    assert result.error is not None and result.error["ename"] == "DebugCheckError"
    assert "aten.sqrt produced NaN" in result.error["evalue"]
    assert "line 4: bad = torch.sqrt(q)" in result.error["evalue"]
    # the kernel is consistent afterwards: earlier results exist, the default mode is back
    assert xla_kernel.value("ok.cpu().tolist()") == [2.0, -2.0]
    assert xla_kernel.value("tpunb.current_mode()") == "strict"


def test_debug_checks_of_a_loss_add_no_host_round_trips(xla_kernel: Kernel) -> None:
    """The class-index check of a cross-entropy (ignored targets included) stays on the device:
    a boolean mask would run ``nonzero`` on the CPU, and tpunb would warn the user about it."""
    code = (
        "%%tpu_mode debug\nlogits = torch.randn(4, 3, device='xla', requires_grad=True)\n"
        "ce = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 2, -100, 1], device='xla'))\n"
        "ce.backward()"
    )
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    assert "ran on the CPU" not in result.stderr, result.stderr
    assert xla_kernel.value("logits.grad[2].abs().sum().item()") == 0.0  # the ignored row


def test_memory_is_none_on_the_cpu_device(xla_kernel: Kernel) -> None:
    assert xla_kernel.value("tpunb.stats()['memory']") is None
    shown = xla_kernel.run("%tpu_monitor")
    assert "memory n/a" in shown.stdout + shown.text


def test_cpu_fallback_is_named_in_a_warning(xla_kernel: Kernel) -> None:
    result = xla_kernel.run("nz = torch.nonzero(torch.tensor([0.0, 2.0, 3.0], device='xla'))")
    assert result.error is None, result.error
    assert "ran on the CPU" in result.stderr and "aten::nonzero" in result.stderr
    assert last_cell(xla_kernel)["counters"]["cpu fallback: aten::nonzero"] == 1


def test_compile_mode_traces_a_training_step_into_one_graph(xla_kernel: Kernel) -> None:
    setup = (
        "model = torch.nn.Linear(8, 2).to('xla')\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = torch.randn(16, 8, device='xla')\n"
        "target = torch.randn(16, 2, device='xla')"
    )
    assert xla_kernel.run(setup).error is None
    step = (
        "%%tpu_mode compile\nopt.zero_grad()\nloss = torch.nn.functional.mse_loss(model(data), target)\n"
        "loss.backward()\nopt.step()"
    )
    first = xla_kernel.run(step)
    assert first.error is None, first.error
    assert last_cell(xla_kernel)["counters"]["graphs executed"] == 1
    assert xla_kernel.value("tpunb.stats()['compiled'][-1]['graphs']") == 1
    assert xla_kernel.run(step).error is None  # same step, same graph: from the cache
    cell = last_cell(xla_kernel)
    assert cell["compiled_graphs"] == 0 and cell["cache_hits"] >= 1
    losses = xla_kernel.value("[float(torch.nn.functional.mse_loss(model(data), target).cpu())]")
    assert losses[0] > 0


def test_tpunb_compile_uses_openxla(xla_kernel: Kernel) -> None:
    code = (
        "def scaled(v):\n    return (v * 3).sin() + 1\n"
        "fn = tpunb.compile(scaled)\nout = fn(torch.ones(4, device='xla'))\n"
        "expected = torch.ones(4).mul(3).sin().add(1)"
    )
    assert xla_kernel.run(code).error is None
    assert xla_kernel.value("torch.allclose(out.cpu(), expected)") is True
    assert xla_kernel.value("tpunb.stats()['compiled'][-1]['graphs']") >= 1


def test_mode_switch_inside_a_cell_flushes_pending_lazy_work(xla_kernel: Kernel) -> None:
    assert xla_kernel.run("%tpu_mode fused").error is None
    code = "m = torch.full((4,), 2.0, device='xla')\nm = m * m\ntpunb.set_mode('strict')\nn = m + 1"
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    # one graph for the fused part, flushed at the switch, then one eager op
    assert last_cell(xla_kernel)["counters"]["graphs executed"] == 2
    assert xla_kernel.value("tpunb.stats()['groups'][-1]['trigger']") == "cell end"
    assert xla_kernel.value("n.cpu().tolist()") == [5.0, 5.0, 5.0, 5.0]


def test_failed_fused_cell_keeps_earlier_work(xla_kernel: Kernel) -> None:
    code = "%%tpu_mode fused\nkept = torch.ones(3, device='xla') * 7\n"
    code += "broken = kept @ torch.ones(2, 2, device='xla')\n"
    result = xla_kernel.run(code)
    assert result.error is not None and "line 3" in "".join(result.error["traceback"])
    assert xla_kernel.value("kept.cpu().tolist()") == [7.0, 7.0, 7.0]
    assert xla_kernel.value("tpunb.current_mode()") == "strict"


MISMATCHED_MATMULS = [
    "torch.ones(1, 3, device='xla') @ w",
    "torch.nn.functional.linear(torch.ones(4, 3, device='xla'), w)",
]


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
@pytest.mark.parametrize("call", MISMATCHED_MATMULS)
def test_a_mismatched_matmul_is_an_error_not_a_dead_kernel(xla_kernel: Kernel, mode: str, call: str) -> None:
    """torch_xla 2.8 aborts the process here without tpunb's shape guard; 2.9 raises."""
    result = xla_kernel.run(f"%%tpu_mode {mode}\nw = torch.ones(2, 2, device='xla')\nbad = {call}\n")
    assert result.error is not None and result.error["ename"] == "RuntimeError", result.error
    assert "line 3" in "".join(result.error["traceback"])
    assert xla_kernel.value("w.cpu().sum().item()") == 4.0


def test_persistent_cache_before_and_after_the_first_computation(tmp_path: Path) -> None:
    kernel = start_xla_kernel(tmp_path)
    try:
        # tpunb itself never starts the PJRT runtime (that would forbid spawning processes later)
        for cell in (
            "%%tpu_mode fused\npass",
            "%%tpu_mode debug\npass",
            "stats = tpunb.stats()",
            "%tpu_monitor",
        ):
            assert kernel.run(cell).error is None
        assert kernel.value("torch_xla._XLAC._xla_runtime_is_initialized()") is False
        cache = tmp_path / "xla-cache"
        result = kernel.run(f"%tpu_cache {cache}")
        assert result.error is None, result.error
        assert f"compile cache at {cache}" in result.stdout
        assert kernel.run("%%tpu_mode fused\nc = torch.ones(3, device='xla') + 1").error is None
        assert any(cache.iterdir())  # torch_xla wrote the compiled program there
        late = kernel.run(f"%tpu_cache {tmp_path / 'other'}")
        assert late.error is not None and "before the first XLA computation" in late.error["evalue"]
    finally:
        kernel.shutdown()


def test_detected_from_pjrt_device_without_tpunb_runtime(tmp_path: Path) -> None:
    kernel = start_kernel(tmp_path, env={"PJRT_DEVICE": "CPU"})
    try:
        loaded = kernel.run("%load_ext tpunb", timeout=300)
        assert "xla runtime on xla:0 (torch_xla installed and PJRT_DEVICE=CPU)" in loaded.stdout
    finally:
        kernel.shutdown()


def test_selftest_runs_every_mode_on_the_xla_device(xla_kernel: Kernel) -> None:
    result = xla_kernel.run("%tpu_doctor --selftest --json", timeout=300)
    assert result.error is None, result.error
    selftest = json.loads(result.stdout)["selftest"]
    assert (selftest["runtime"], selftest["device"]) == ("xla", "xla:0")
    steps = {step["name"]: step for step in selftest["steps"]}
    assert {name: step["status"] for name, step in steps.items()} == {
        "debug": "ok",
        "strict": "ok",
        "fused": "ok",
        "compile": "ok",
        "memory": "ok",
        "cache dir": "ok",
    }, steps
    assert "xla:0 reports no memory figures" in steps["memory"]["detail"]
    assert xla_kernel.value("tpunb.current_mode()") == "strict"


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_a_cpu_backward_before_the_xla_device_leaves_xla_backward_working(tmp_path: Path, mode: str) -> None:
    """A model checked on the CPU first, then moved to the device: autograd sizes its device
    queues at the first backward, before the runtime has started (tpunb starts it first)."""
    kernel = start_xla_kernel(tmp_path)
    try:
        assert kernel.value("torch_xla._XLAC._xla_runtime_is_initialized()") is False
        on_cpu = "model = torch.nn.Linear(4, 2)\nmodel(torch.randn(3, 4)).sum().backward()"
        assert kernel.run(f"%%tpu_mode {mode}\n{on_cpu}").error is None
        on_xla = (
            "model = model.to('xla')\nmodel.zero_grad()\n"
            "model(torch.ones(3, 4, device='xla')).sum().backward()\n"
            "grad = model.weight.grad.cpu().tolist()"
        )
        result = kernel.run(f"%%tpu_mode {mode}\n{on_xla}")
        assert result.error is None, result.error
        assert kernel.value("grad") == [[3.0] * 4] * 2  # d(sum(Wx + b))/dW with x = ones: 3 rows
    finally:
        kernel.shutdown()


def test_a_model_moved_to_the_device_keeps_its_tied_weights_and_its_optimizer(xla_kernel: Kernel) -> None:
    """PyTorch makes new parameters when it moves a module onto torch_xla's tensors (their type
    cannot take a CPU tensor's place), which unties tied weights and leaves an optimizer made
    before the move holding CPU tensors; with tpunb loaded, the move keeps each parameter."""
    code = """
torch.manual_seed(0)
tied = torch.nn.ModuleDict({"embed": torch.nn.Embedding(16, 8), "head": torch.nn.Linear(8, 16, bias=False)})
tied["head"].weight = tied["embed"].weight
before = tied["embed"].weight
tied_optimizer = torch.optim.SGD(tied.parameters(), lr=0.5)
tied.to("xla")
tied_loss = tied["head"](tied["embed"](torch.arange(4, device="xla"))).logsumexp(-1).mean()
tied_loss.backward()
tied_optimizer.step()
moved = (tied["head"].weight is tied["embed"].weight, tied["embed"].weight is before,
         tied["embed"].weight.device.type, len(list(tied.parameters())))
"""
    result = xla_kernel.run(code)
    assert result.error is None, result.error
    assert xla_kernel.value("moved") == [True, True, "xla", 1]
    assert xla_kernel.value("torch.__future__.get_swap_module_params_on_conversion()") is True
