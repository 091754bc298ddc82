"""``%tpu_precision`` and ``%%tpu_precision`` in a real kernel: the cells' dtypes, the summary
line, restoring after a failed cell, and compile mode under autocast."""

from __future__ import annotations

import re

MATMUL = "(torch.randn(64, 64) @ torch.randn(64, 64)).dtype"


def test_the_line_magic_sets_later_cells_and_the_summary_says_so(kernel):
    shown = kernel.run("%tpu_precision")
    assert shown.stdout == "tpunb: precision fp32 (accepted on this runtime: fp32, bf16)\n", shown.stdout
    assert kernel.run("%tpu_precision bf16").stdout == "tpunb: precision bf16 (was fp32)\n"
    cell = kernel.run(f"dtype = str({MATMUL})")
    assert cell.error is None and kernel.value("dtype") == "torch.bfloat16"
    assert re.search(r"^\[tpunb\] strict · bf16 · [\d.]+ s", cell.stdout, re.M), cell.stdout
    assert kernel.value("tpunb.stats()['precision']") == "bf16"
    assert kernel.run("%tpu_precision fp32").error is None
    assert kernel.value(f"str({MATMUL})") == "torch.float32"


def test_the_cell_magic_runs_one_cell_and_restores_even_when_it_fails(kernel):
    one = kernel.run(f"%%tpu_precision bf16\ninside = str({MATMUL})")
    assert one.error is None and kernel.value("inside") == "torch.bfloat16"
    failed = kernel.run("%%tpu_precision bf16\nx = torch.ones(2)\n1 / 0")
    assert failed.error is not None and failed.error["ename"] == "ZeroDivisionError"
    assert kernel.value("tpunb.stats()['precision']") == "fp32"
    assert kernel.value(f"str({MATMUL})") == "torch.float32"


def test_compile_mode_compiles_under_autocast(kernel):
    setup = "model = torch.nn.Linear(64, 8)\nx = torch.randn(4, 64)"
    assert kernel.run(setup).error is None
    assert kernel.run("%tpu_mode compile").error is None
    try:
        result = kernel.run("%%tpu_precision bf16\ny = model(x)\ny_dtype = str(y.dtype)")
        assert result.error is None, result.error
        assert kernel.value("y_dtype") == "torch.bfloat16"
        assert re.search(r"^\[tpunb\] compile · bf16 · .*1 graph compiled", result.stdout, re.M), (
            result.stdout
        )
    finally:
        assert kernel.run("%tpu_mode strict").error is None
