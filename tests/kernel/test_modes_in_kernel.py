"""Modes through a real kernel: the magics, errors, restoring, summaries."""

from __future__ import annotations

import re

NAN_CELL = "%%tpu_mode debug\nx = torch.tensor([-1.0])\ny = torch.log(x)\n"


def test_load_prints_one_status_line(fresh_kernel):
    result = fresh_kernel.run("%load_ext tpunb")
    assert result.error is None, result.error
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    assert re.match(r"tpunb \S+ · native runtime on cpu \(.+\) · host RSS .+ / .+ · mode strict$", lines[0])


def test_loading_twice_is_harmless(kernel):
    again = kernel.run("%load_ext tpunb\n%reload_ext tpunb")
    assert again.error is None, again.error
    kernel.run("%tpu_mode debug")
    result = kernel.run("z = torch.ones(2) * 3")
    # one summary line, not two: hooks were registered once
    assert result.stdout.count("[tpunb] debug") == 1


def test_extension_loads_from_kernel_config(tmp_path):
    from tpunb_kernels import start_kernel

    started = start_kernel(tmp_path, ["--InteractiveShellApp.extensions=tpunb"])
    try:
        assert started.value("__import__('tpunb').current_mode()") == "strict"
        shown = started.run("%tpu_mode")
        assert shown.error is None and "current mode: strict" in shown.stdout
    finally:
        started.shutdown()


def test_bad_mode_is_a_usage_error_and_changes_nothing(kernel):
    kernel.run("%tpu_mode debug")
    result = kernel.run("%tpu_mode turbo")
    assert result.error is not None
    assert result.error["ename"] == "UsageError"
    assert "'turbo'" in result.error["evalue"]
    assert "'debug', 'strict', 'fused', 'compile'" in result.error["evalue"]
    assert kernel.value("tpunb.current_mode()") == "debug"


def test_mode_names_are_case_insensitive(kernel):
    result = kernel.run("%tpu_mode DEBUG")
    assert result.error is None, result.error
    assert kernel.value("tpunb.current_mode()") == "debug"


def test_debug_cell_reports_nan_at_the_users_line(kernel):
    result = kernel.run(NAN_CELL)
    assert result.error is not None
    assert result.error["ename"] == "DebugCheckError"
    assert "aten.log" in result.error["evalue"]
    assert re.search(r"Cell In\[\d+\], line 3: y = torch.log\(x\)", result.error["evalue"])
    # the mode is restored after the failing cell, and the kernel is usable
    assert kernel.value("tpunb.current_mode()") == "strict"
    assert kernel.value("float(x.item())") == -1.0


def test_strict_runs_the_same_code_without_error(kernel):
    result = kernel.run(NAN_CELL.replace("debug", "strict"))
    assert result.error is None, result.error
    assert kernel.value("str(y.item())") == "nan"


def test_debug_default_checks_backward(kernel):
    kernel.run("%tpu_mode debug")
    result = kernel.run(
        "w = torch.zeros(3, requires_grad=True)\nloss = torch.sqrt(w).sum()\nloss.backward()\n"
    )
    assert result.error is not None and result.error["ename"] == "DebugCheckError"
    assert "Inf" in result.error["evalue"]
    assert re.search(r"Cell In\[\d+\], line 3: loss.backward\(\)", result.error["evalue"])


def test_allow_nan_lets_nan_through(kernel):
    kernel.run("%tpu_mode debug --allow-nan")
    result = kernel.run("y = torch.log(torch.tensor([-1.0]))")
    assert result.error is None, result.error


def test_cell_magic_keeps_cell_semantics(kernel):
    result = kernel.run("%%tpu_mode debug\na = torch.arange(4.0)\nb = a * 2\nb.sum()")
    assert result.error is None, result.error
    assert "tensor(12.)" in result.text
    assert kernel.value("b.tolist()") == [0.0, 2.0, 4.0, 6.0]


def test_summary_line_after_non_strict_cells(kernel):
    debug = kernel.run("%%tpu_mode debug\nq = torch.ones(3).sum()")
    assert re.search(r"^\[tpunb\] debug · [\d.]+ s$", debug.stdout, re.M), debug.stdout
    strict = kernel.run("q = torch.ones(3).sum()")
    assert "[tpunb]" not in strict.stdout
    kernel.run("%tpu_summary off")
    quiet = kernel.run("%%tpu_mode debug\nq = torch.ones(3).sum()")
    assert "[tpunb]" not in quiet.stdout


def test_interrupt_restores_mode_and_keeps_kernel_usable(kernel):
    result = kernel.interrupt_after(
        "%%tpu_mode debug\nt = torch.zeros(8)\nwhile True:\n    t = t + 1\n", seconds=3
    )
    assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
    assert kernel.value("tpunb.current_mode()") == "strict"
    assert kernel.value("bool(torch.all(t == t[0]))") is True
    assert kernel.run("u = torch.log(torch.tensor([-1.0]))").error is None


def test_stats_snapshot_from_the_kernel(kernel):
    kernel.run("%tpu_mode debug")
    stats = kernel.value("tpunb.stats()")
    assert stats["runtime"] == "native" and stats["device"] == "cpu"
    assert stats["mode"] == "debug"
    assert set(stats["memory"]) == {"used", "peak", "limit", "label"}
    assert stats["cache"] == {"requests": 0, "hits": 0, "misses": 0, "compiles": 0}
    assert stats["groups"] == []  # nothing ran fused yet


def test_selftest_in_a_fused_kernel_runs_every_mode_and_leaves_the_mode(kernel):
    kernel.run("%tpu_mode fused\nkept = torch.arange(4.0) * 2")
    result = kernel.run("%tpu_doctor --selftest", timeout=300)
    assert result.error is None, result.error
    table = result.stdout[result.stdout.index("tpunb self-test") :]
    for check in ("debug", "strict", "fused", "compile", "memory", "cache dir"):
        assert re.search(rf"^ok    {check} ", table, re.MULTILINE), table
    assert "self-test: every mode works here" in table
    assert kernel.value("[tpunb.current_mode(), kept.tolist()]") == ["fused", [0.0, 2.0, 4.0, 6.0]]


def _prompt(result) -> int:
    """The number the notebook shows for the cell (``In [N]``): its execute_input message's."""
    return next(m["content"]["execution_count"] for m in result.messages if m["msg_type"] == "execute_input")


def test_tpunb_names_the_running_cell_by_its_prompt_number(kernel):
    """IPython 9 counts a cell before running it: ``shell.execution_count`` is then the next
    cell's number, and tpunb named every cell one too high."""
    failed = kernel.run(NAN_CELL)
    assert f"Cell In[{_prompt(failed)}], line 3" in failed.error["evalue"], failed.error["evalue"]
    fused = kernel.run("%%tpu_mode fused\nz = torch.randn(4096)\ntotal = (z * 2 + 1).sum().item()")
    assert fused.error is None, fused.error
    stats = "tpunb.stats()"
    trigger, cell = kernel.value(f"[{stats}['groups'][-1]['trigger'], {stats}['last_cell']['cell']]")
    assert f"Cell In[{_prompt(fused)}], line 3" in trigger, trigger
    assert cell == _prompt(fused)
