"""A failed cell shows the user's frames and the message that explains (tpunb/tracebacks.py):
no magic call, no tpunb, PyTorch or IPython frames where tpunb ran the cell; a cell tpunb
left alone fails as in plain IPython; ``%debug`` and ``%xmode Verbose`` still see every frame."""

from __future__ import annotations

import re

import pytest

#: The longest traceback, in lines, an error in a tpunb cell may show by default (the frame of
#: the user's line with IPython's context, the message; was 36 to 276 lines).
MOST_LINES = 16

CELLS = {
    "debug": (
        "%%tpu_mode debug\nloss = torch.sqrt(w - 1).sum()\nloss.backward()",
        "DebugCheckError",
        2,
        "aten.sqrt produced NaN",
    ),
    "debug backward": (
        "%%tpu_mode debug\nloss = torch.sqrt(w).sum()\nloss.backward()",
        "DebugCheckError",
        3,
        "in SqrtBackward0",
    ),
    "fused": (
        "%%tpu_mode fused\nidx = torch.tensor([1, 7])\nout = emb(idx) * 2\nprint(out.sum().item())",
        "FusedOpError",
        4,
        "index 7 is out of bounds for the embedding table (size 4; valid [0, 4))",
    ),
    "compile": ("%%tpu_mode compile\nq = torch.ones(4)\nbad = q @ torch.ones(3)", "RuntimeError", 3, "size"),
}


def shown(result) -> list[str]:
    text = "\n".join(result.error["traceback"])
    return re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()


@pytest.fixture
def tensors(kernel):
    assert kernel.run("w = torch.zeros(3, requires_grad=True)\nemb = torch.nn.Embedding(4, 2)").error is None
    return kernel


@pytest.mark.parametrize("case", list(CELLS))
def test_a_tpunb_cell_error_shows_the_users_line_first_and_only(tensors, case: str) -> None:
    code, ename, line, message = CELLS[case]
    result = tensors.run(code)
    assert result.error is not None and result.error["ename"] == ename, result.error
    lines = shown(result)
    frames = [x for x in lines if re.match(r"^(Cell In\[\d+\]|File )", x)]
    assert frames and re.match(rf"^Cell In\[\d+\], line {line}\b", frames[0]), lines
    assert len(frames) == 1, frames  # the user's line only: no magic call, no internals
    assert not any("run_cell_magic" in x or "skipping hidden" in x for x in lines), lines
    assert message in lines[-1] or any(message in x for x in lines[-5:]), lines
    assert len(lines) <= MOST_LINES, "\n".join(lines)


def test_the_kernel_keeps_every_frame_for_debugging(tensors) -> None:
    result = tensors.run(CELLS["fused"][0])
    assert result.error["ename"] == "FusedOpError"
    assert tensors.run("import sys, traceback").error is None
    files = tensors.value("[f.filename for f in traceback.extract_tb(sys.last_traceback)]")
    assert any(name.endswith("engine.py") for name in files), files  # what %debug walks
    assert tensors.value("type(sys.last_value.__cause__).__name__") == "IndexError"


def test_xmode_verbose_shows_everything(tensors) -> None:
    assert tensors.run("%xmode Verbose").error is None
    try:
        lines = shown(tensors.run(CELLS["fused"][0]))
    finally:
        tensors.run("%xmode Context")
    assert any("fuse/groups/flush.py" in x for x in lines) and any("direct cause" in x for x in lines)


def test_a_strict_cell_fails_as_in_plain_ipython(tensors) -> None:
    """An error inside torch code in strict mode: tpunb is not among the frames, and IPython's
    own traceback (torch's frames included) is shown unchanged."""
    result = tensors.run("layer = torch.nn.Linear(3, 2)\nlayer(torch.ones(4))")
    assert result.error["ename"] == "RuntimeError"
    lines = shown(result)
    assert any("torch/nn/modules/linear.py" in x for x in lines), lines
    syntax = tensors.run("x = (1,")
    assert syntax.error["ename"] == "SyntaxError"
    assert any("SyntaxError" in x for x in shown(syntax))


def test_deferred_work_failing_as_a_default_fused_cell_ends_is_the_cells_error(tensors) -> None:
    """With fused the default, a cell's last group runs as its scope closes, after its code: a
    failure there is the cell's error (the reply says so), shown as its message naming the line
    that recorded the op, not as an error in a callback with tpunb's frames."""
    assert tensors.run("%tpu_mode fused").error is None
    result = tensors.run("idx = torch.tensor([1, 7])\nout = emb(idx) * 2")
    assert result.error is not None and result.error["ename"] == "FusedOpError", result
    lines = shown(result)
    assert not any(re.match(r"^(Cell In\[\d+\]|File )", x) for x in lines), lines
    assert "index 7 is out of bounds" in lines[-2] and "line 2: out = emb(idx) * 2" in lines[-1], lines
    assert "Error in callback" not in result.stdout + result.stderr
    assert re.search(r"^\[tpunb\] fused · .* · failed: FusedOpError$", result.stdout, re.M), result.stdout
    assert tensors.run("%tpu_mode strict").error is None
