"""``%%tpu_profile`` in a real kernel: the report under the cell, the trace file, and for each
planted problem the right finding at the top, at the right line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tpunb_kernels import start_kernel

MLP = """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)

def step(n=64):
    x, y = torch.randn(n, 256), torch.randint(0, 10, (n,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
"""

#: Many tiny ops a step: 24 layers of 16 features on a batch of 4.
DEEP = """
torch.manual_seed(0)
deep = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(24)])
deep_opt = torch.optim.SGD(deep.parameters(), lr=0.01)
tiny_batch = torch.randn(4, 16)

def tiny_step():
    loss = deep(tiny_batch).square().mean()
    loss.backward()
    deep_opt.step()
    deep_opt.zero_grad()
    return loss
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One kernel for the module (each test's cells use names of their own)."""
    started = start_kernel(tmp_path_factory.mktemp("profile-kernel"))
    ready = started.run("%load_ext tpunb\nimport torch, tpunb" + MLP + DEEP)
    assert ready.error is None, ready.error
    yield started
    started.shutdown()


def last(kernel, expression: str):
    return kernel.value(f"tpunb.last_profile().{expression}")


def line_of(cell: str, text: str) -> int:
    """The cell's line number (1-based, the magic's line included) that contains ``text``."""
    return next(i for i, line in enumerate(cell.splitlines(), 1) if text in line)


def test_a_fused_training_cell_shows_its_report_and_saves_a_trace(profiled, tmp_path):
    cell = f"%%tpu_profile --mode fused --trace {tmp_path} --top 5\nfor _ in range(6):\n    step().item()"
    result = profiled.run(cell)
    assert result.error is None, result.error
    shown = result.displays[-1]
    assert shown["text/plain"].startswith("tpunb profile · fused · native (cpu)"), shown["text/plain"]
    assert "Top ops (self time)" in shown["text/plain"] and "<table>" in shown["text/html"]
    assert "data:image/png;base64," in shown["text/html"]  # the timeline
    top_ops = last(profiled, "top_ops")
    assert 1 <= len(top_ops) <= 5 and all(op["calls"] >= 1 for op in top_ops)
    costs = [op["host_ms"] + (op["device_ms"] or 0) for op in top_ops]
    assert costs == sorted(costs, reverse=True)
    groups = last(profiled, "groups")
    assert {g["status"] for g in groups} <= {"miss", "hit", "compiling", "op by op"}, groups
    # the first step recorded, then the model's call and the optimizer's step hot, run eagerly
    # until their compile pays off (fuse/hot/payoff.py): a row each says so
    assert {"Sequential-training", "SGD-step"} <= {g["key"] for g in groups}, groups
    trace = Path(last(profiled, "trace_path"))
    assert trace.parent == tmp_path and trace.suffix == ".json"
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    # the top ops are the profiler's own: each is in the trace it saved
    assert {op["name"] for op in top_ops} <= {e.get("name") for e in events}, top_ops
    phases = [e for e in events if e.get("cat") == "tpunb"]
    assert any(e["name"].startswith("run ") for e in phases), phases[:5]
    assert profiled.value("tpunb.current_mode()") == "strict"  # --mode was for this cell only


#: Where each kind of step's recompiles are found: a hot model's calls (the default) at the
#: line that calls the model; the recorder's groups (``--no-hot-training``) where each step's
#: first op is recorded, the batch drawn in step().
STORM_LINES = {
    "": r"loss = torch\.nn\.functional\.cross_entropy\(model\(x\), y\)",
    " --no-hot-training": r"x, y = torch\.randn\(n, 256\), .*",
}


@pytest.mark.parametrize("options", list(STORM_LINES))
def test_ragged_batches_are_a_recompile_finding_at_the_step_line(profiled, options):
    # the step's first shapes ran before (the model turned hot): each ragged batch below is new
    warm = f"%%tpu_mode fused --sync-compile{options}\nfor _ in range(4):\n    step().item()"
    assert profiled.run(warm).error is None
    # compiles waited for: the profiled cell's mode stack is new to Dynamo too (its guards), and
    # with compiles in the background each new shape may find the worker still on the last one
    assert profiled.run(f"%tpu_mode fused --sync-compile{options}").error is None
    cell = "%%tpu_profile\nfor n in [40, 56, 72, 88] * 3:\n    step(n).item()"
    result = profiled.run(cell)
    assert profiled.run("%tpu_mode strict").error is None
    assert result.error is None, result.error
    top = last(profiled, "findings")[0]
    assert top["kind"] == "recompile", last(profiled, "findings")
    assert re.fullmatch(r"Cell In\[\d+\], line \d+: " + STORM_LINES[options], top["at"]), top
    assert "shape" in top["evidence"] and top["seconds"] > 0
    assert "1. recompile" in result.displays[-1]["text/plain"]


def test_an_item_every_step_is_a_host_sync_finding_at_its_line(profiled):
    """The recorder's steps (``--no-hot-training``): each ``.item()`` waits for a group. (A new
    model: the last one is hot from the tests above, its parameters no longer adopted.)"""
    warm = "%%tpu_mode fused --sync-compile --no-hot-training\nfor _ in range(3):\n    step().item()"
    assert profiled.run(MLP).error is None
    assert profiled.run(warm).error is None
    assert profiled.run("%tpu_mode fused --no-hot-training").error is None
    cell = "%%tpu_profile\nlosses = []\nfor _ in range(12):\n    losses.append(step().item())"
    result = profiled.run(cell)
    assert profiled.run("%tpu_mode strict").error is None
    assert result.error is None, result.error
    top = last(profiled, "findings")[0]
    assert top["kind"] == "host_sync", last(profiled, "findings")
    assert re.fullmatch(r"Cell In\[\d+\], line " + str(line_of(cell, "losses.append")), top["at"]), top
    assert ".item()" in top["message"] and "12×" in top["message"]
    waits = last(profiled, "waits")
    assert waits == [{**waits[0], "count": 12, "what": ".item()"}]
    # one group a step, as without the profiler (whose shape recording would split each step)
    assert [g["trigger"].split(" at ")[0] for g in last(profiled, "groups")] == [".item()"] * 12


def test_a_fused_loop_of_tiny_ops_is_a_capture_finding(profiled):
    """The recorder's steps (``--no-hot-training``): recording tiny ops costs more than running
    them."""
    warm = "%%tpu_mode fused --sync-compile --no-hot-training\nfor _ in range(3):\n    tiny_step().item()"
    assert profiled.run(warm).error is None
    assert profiled.run("%tpu_mode fused --no-hot-training").error is None
    result = profiled.run("%%tpu_profile\nfor _ in range(10):\n    tiny_step().item()")
    assert profiled.run("%tpu_mode strict").error is None
    assert result.error is None, result.error
    top = last(profiled, "findings")[0]
    assert top["kind"] == "capture", last(profiled, "findings")
    assert "%tpu_mode compile" in top["fix"]


def test_a_cell_that_raises_shows_the_profile_up_to_the_error(profiled):
    cell = "%%tpu_profile --mode fused\nfor i in range(3):\n    step().item()\n    if i == 1:\n        1 / 0"
    result = profiled.run(cell)
    assert result.error is not None and result.error["ename"] == "ZeroDivisionError"
    assert "stopped by ZeroDivisionError" in result.displays[-1]["text/plain"]
    assert last(profiled, "error") == "ZeroDivisionError"
    # the first step's .item() waited for its recorded group; the hot steps after it, nothing
    assert len(last(profiled, "waits")) == 1 and last(profiled, "waits")[0]["count"] == 1
    assert profiled.value("tpunb.current_mode()") == "strict"
    assert profiled.run("print(float(step()) > 0)").stdout.strip() == "True"  # the kernel goes on


def test_the_current_mode_is_profiled_without_mode(profiled):
    result = profiled.run("%tpu_mode fused")
    assert result.error is None
    try:
        profiled_cell = profiled.run(
            "%%tpu_profile\ny = (torch.randn(300, 300) @ torch.randn(300, 300)).sum()\nfloat(y)"
        )
        assert profiled_cell.error is None, profiled_cell.error
        assert last(profiled, "mode") == "fused"
        assert profiled_cell.text  # the cell's value is still its result
    finally:
        assert profiled.run("%tpu_mode strict").error is None
