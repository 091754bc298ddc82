"""``tpunb.profile()`` in a script: the report it fills in, its waits, errors and bad arguments,
and the rules behind the findings that the kernel tests cannot plant on a CPU (memory, CPU
fallbacks)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import tpunb
from tpunb.events import FusionGroup
from tpunb.profiling import ProfileError
from tpunb.profiling.findings import Observed, cpu_fallbacks, findings, memory
from tpunb.runtimes import CPU_FALLBACK, MemoryInfo

WIDTH = 256


def here() -> int:
    return sys._getframe(1).f_lineno


def test_a_strict_block_gives_top_ops_a_trace_and_a_text_report(tmp_path):
    a = torch.randn(WIDTH, WIDTH)
    with tpunb.profile(mode="strict", trace=tmp_path, top=3, shapes=True) as report:
        assert not report.done and "still running" in report.text()
        for _ in range(4):
            b = (a @ a).relu()
    assert report.done and report.mode == "strict" and report.error is None
    # (mm is usually first, but its rank against relu is the machine's: a busy CPU swapped them)
    mm = next((op for op in report.top_ops if op["name"] == "aten::mm"), None)
    assert mm is not None, report.top_ops
    assert mm["calls"] == 4 and mm["shapes"] == [[WIDTH, WIDTH], [WIDTH, WIDTH]]
    costs = [op["host_ms"] + (op["device_ms"] or 0) for op in report.top_ops]
    assert costs == sorted(costs, reverse=True)
    assert len(report.top_ops) == 3 and b.shape == (WIDTH, WIDTH)
    trace = json.loads(Path(report.trace_path).read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    text = str(report)
    assert text.startswith("tpunb profile · strict · native (cpu)") and "aten::mm" in text
    assert tpunb.last_profile() is report


def test_reads_of_plain_tensors_are_waits_at_their_line_and_a_read_inside_a_read_counts_once(tmp_path):
    x = torch.ones(3)
    with tpunb.profile(mode="strict", trace=tmp_path) as report:
        for _ in range(3):
            x.sum().item()
            line = here() - 1
        text = repr(x)  # formatting reads every element: one wait
    rows = {(row["what"], row["at"]): row["count"] for row in report.waits}
    assert rows[(".item()", f"test_profile_api.py:{line}")] == 3
    assert rows[("print / repr", f"test_profile_api.py:{line + 2}")] == 1 and "1." in text


def test_a_fused_block_s_reads_are_the_engine_s_flushes(tmp_path):
    model = torch.nn.Linear(WIDTH, WIDTH)
    tpunb.adopt(model)
    x = torch.randn(8, WIDTH)
    with tpunb.profile(mode="fused", trace=tmp_path) as report:
        for _ in range(3):
            model(x).sum().item()
    assert report.waits == [
        {"at": report.waits[0]["at"], "what": ".item()", "count": 3, "seconds": report.waits[0]["seconds"]}
    ]
    assert len(report.groups) == 3 and all(g["wait"] for g in report.groups)


def test_a_fused_loop_whose_groups_compile_in_the_background_blames_the_compile(tmp_path, monkeypatch):
    """The block waits at its end for the compiles it started: that time is attributed, the
    finding that ranks first is the compile, and the parts add up to the block's time. (Its
    compiles start from an empty Inductor cache: one a run before filled would be quick.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.randn(512, WIDTH)
    with tpunb.profile(mode="fused", trace=tmp_path) as report:
        for step in range(6):
            y = x
            for _ in range(8):  # a chain of elementwise ops on a tensor too big for a tiny group
                y = (y * 1.01 + 0.5).relu() - 0.25
            y.sum().item() + step
    assert report.findings[0]["kind"] == "compile_time", report.findings
    split = report.time_split
    assert split["waiting for background compiles"] > 0.5 * report.wall_s, split
    parts = sum(s for part, s in split.items() if part != "compiling on the worker (overlapped)")
    assert parts == pytest.approx(report.wall_s, rel=0.02), split
    assert any(row["compile_ms"] for row in report.groups)  # on the row of the group that compiled
    assert "Where the time went" in report.text()


def test_a_compile_an_earlier_block_left_running_is_waited_for_first_not_counted(tmp_path, monkeypatch):
    """A fused cell ends without waiting for its compiles; a profile right after it waits for
    them before its block starts (and says so), so that they neither count as the block's nor
    delay the block's own compiles queued behind them."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.randn(512, WIDTH)
    with tpunb.mode("fused"):
        for _ in range(2):  # the second sighting starts the group's compile on the worker
            (x * 1.5 + 0.5).relu().sum().item()
    with tpunb.profile(mode="strict", trace=tmp_path) as report:
        (x @ x.T).sum().item()
    assert report.earlier_compiles_s > 0 and "waiting for earlier cells' compiles" in report.text()
    assert "compiling on the worker (overlapped)" not in report.time_split, report.time_split
    assert all(f["kind"] != "compile_time" for f in report.findings), report.findings


def test_a_compile_a_flush_waited_for_is_counted_once_and_not_as_a_wait_for_values(tmp_path):
    """With ``sync_compile`` each new shape compiles inside the flush that reads the loss: the
    recompile finding counts those flushes once (their run time holds the compile), and the
    waits at the read are what is left (reading less often would not save a compile)."""
    model = torch.nn.Linear(WIDTH, WIDTH)
    tpunb.adopt(model)
    # (the recorder's groups: hot training would compile the module whole from its 3rd call)
    with tpunb.profile(trace=tmp_path) as report, tpunb.mode("fused", sync_compile=True, hot_training=False):
        for rows in (40, 56, 72, 88):
            model(torch.randn(rows, WIDTH)).relu().sum().item()
    compiled = [g for g in report.groups if g["compile_ms"]]
    assert len(compiled) == 4, report.groups
    [storm] = [f for f in report.findings if f["kind"] == "recompile"]
    stormed_s = sum(g["run_ms"] for g in compiled[1:]) / 1000  # the first shape is no recompile
    assert storm["seconds"] == pytest.approx(stormed_s, rel=1e-6), (storm, report.groups)
    [reads] = report.waits
    left_s = sum(g["run_ms"] - (g["compile_ms"] or 0) for g in report.groups) / 1000
    assert reads["count"] == 4 and reads["seconds"] == pytest.approx(left_s, rel=1e-6)
    assert "compiling on the worker (overlapped)" not in report.time_split, report.time_split


def test_a_block_that_raises_keeps_its_report_and_the_error_goes_on(tmp_path):
    with pytest.raises(ZeroDivisionError), tpunb.profile(mode="fused", trace=tmp_path) as report:
        torch.ones(WIDTH, WIDTH).sum().item()
        raise ZeroDivisionError
    assert report.done and report.error == "ZeroDivisionError" and report.trace_path
    assert tpunb.current_mode() == "strict" and tpunb.last_profile() is report


def test_bad_arguments_are_refused_before_the_block_runs(tmp_path):
    ran = []
    for arguments, named in [({"top": 0}, "top must be"), ({"trace": "/dev/null/x"}, "'/dev/null/x'")]:
        with pytest.raises(ProfileError, match=named), tpunb.profile(**arguments):
            ran.append(arguments)
    with pytest.raises(ValueError, match="turbo"), tpunb.profile(mode="turbo", trace=tmp_path):
        ran.append("turbo")
    assert ran == []


def observed(**changes) -> Observed:
    base = {
        "wall_s": 1.0,
        "groups": [],
        "compiles": [],
        "compiled_runs": [],
        "waits": [],
        "counters": {},
        "memory": None,
        "op_seconds": {},
    }
    return Observed(**{**base, **changes})


def test_memory_near_the_limit_is_a_finding_and_far_from_it_is_not():
    gib = 2**30
    near = memory(observed(memory=MemoryInfo(used=14 * gib, peak=15 * gib, limit=16 * gib, label="HBM")))
    assert [f.kind for f in near] == ["memory"] and "94%" in near[0].message
    assert memory(observed(memory=MemoryInfo(used=gib, peak=2 * gib, limit=16 * gib, label="HBM"))) == []
    assert memory(observed(memory=MemoryInfo(used=gib, peak=None, limit=None, label="host RSS"))) == []


def test_cpu_fallbacks_name_the_ops_and_cost_their_host_time():
    seen = observed(
        counters={f"{CPU_FALLBACK}aten::nonzero": 4.0, "CompileTime": 2.0},
        op_seconds={"aten::nonzero": 0.25, "aten::mm": 1.0},
    )
    [finding] = cpu_fallbacks(seen)
    assert "aten::nonzero ×4" in finding.message and finding.seconds == 0.25


def test_findings_are_ranked_by_cost_and_at_most_three():
    group = FusionGroup(
        key="k", ops=10, top_ops={}, input_shapes=[], trigger="t", source="s", status="miss",
        compile_ms=None, run_ms=25.0, lifted=0, miss_reason="input 0 (8, 4) → (9, 4)",
    )  # fmt: skip
    rows = [{"at": f"line {i}", "what": ".item()", "count": 5, "seconds": 0.01 * i} for i in range(1, 5)]
    gib = 2**30
    seen = observed(
        groups=[group, group],  # two new shapes at one line
        waits=rows,
        memory=MemoryInfo(used=gib, peak=gib, limit=gib, label="HBM"),
    )
    ranked = findings(seen)
    expected = [("recompile", "s"), ("host_sync", "line 4"), ("host_sync", "line 3")]
    assert [(f.kind, f.at) for f in ranked] == expected  # memory costs no time: ranked out
