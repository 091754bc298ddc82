"""Compile mode through a real kernel: cell semantics, cache reuse, graph breaks, errors."""

from __future__ import annotations

import re

import pytest

TRAIN = """%%tpu_mode compile
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
data, target = torch.randn(32, 8), torch.randn(32, 2)
with torch.no_grad():
    prediction = model(data)
error = torch.nn.functional.mse_loss(prediction, target)
error
"""


def test_a_compiled_cell_keeps_cell_semantics_and_reuses_its_graph(kernel):
    first = kernel.run(TRAIN)
    assert first.error is None, first.error
    assert re.search(r"^\[tpunb\] compile · [\d.]+ s · [1-9]\d* graphs? compiled", first.stdout, re.M), (
        first.stdout
    )
    assert "tensor(" in first.text  # the last expression is shown
    compiled = kernel.value("float(error)")
    strict = kernel.value("float(torch.nn.functional.mse_loss(model(data), target).detach())")
    assert compiled == pytest.approx(strict, rel=1e-5)
    assert kernel.value(
        "sorted(k for k in ('model', 'data', 'target', 'prediction', 'error') if k in globals())"
    ) == [
        "data",
        "error",
        "model",
        "prediction",
        "target",
    ]
    again = kernel.run(TRAIN)
    assert again.error is None, again.error
    assert kernel.value("tpunb.stats()['compiled'][-1]['graphs']") == 0  # Dynamo's cache served it


def test_a_graph_break_runs_correctly_and_is_reported(kernel):
    kernel.run("x = torch.arange(4.0)")
    result = kernel.run("%%tpu_mode compile\ny = x * 3\nprint('y is', y.tolist())\nz = (y + 1).sum()\nz")
    assert result.error is None, result.error
    assert "y is [0.0, 3.0, 6.0, 9.0]" in result.stdout
    assert "tensor(22.)" in result.text
    record = kernel.value("tpunb.stats()['compiled'][-1]")
    assert sum(record["graph_breaks"].values()) >= 1, record
    assert "graph break" in result.stdout


def test_errors_in_a_compiled_cell_point_at_its_line(kernel):
    result = kernel.run("%%tpu_mode compile\nq = torch.ones(4)\nbad = q @ torch.ones(3)\n")
    assert result.error is not None
    text = "\n".join(result.error["traceback"])
    assert re.search(r"Cell In\[\d+\], line 3", re.sub(r"\x1b\[[0-9;]*m", "", text)), text
    assert kernel.value("tpunb.current_mode()") == "strict"


def test_compile_as_the_default_mode(kernel):
    assert kernel.run("%tpu_mode compile").error is None
    result = kernel.run("a = torch.ones(3) + 1\nb = a * 2\nb")
    assert result.error is None, result.error
    assert "tensor([4., 4., 4.])" in result.text
    assert kernel.value("tpunb.stats()['compiled'][-1]['graphs']") >= 1
    plain = kernel.run("import math\nroot = math.sqrt(16)\nroot")  # no tensor work: still fine
    assert plain.error is None and "4.0" in plain.text
    magic = kernel.run("%tpu_mode strict")  # magics are never wrapped
    assert magic.error is None and kernel.value("tpunb.current_mode()") == "strict"
