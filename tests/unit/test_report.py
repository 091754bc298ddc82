from __future__ import annotations

from tpunb.advice import CellTimes, fused_overhead, fused_slower
from tpunb.events import CellRun, FusionGroup
from tpunb.report import cell_summary, format_bytes, format_memory
from tpunb.runtimes import (
    CALLS_FLOPS_UNKNOWN,
    CAPTURE_WAITED,
    MODEL_FLOPS,
    PAST_VERSION_LIMIT,
    STEPS_NOT_COMPILED,
    MemoryInfo,
)


def test_bytes_read_naturally_and_unknown_is_not_zero():
    assert format_bytes(None) == "n/a"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(16 * 1024**3) == "16.0 GiB"


def test_a_memory_figure_the_device_cannot_hold_is_unknown_never_shown():
    gib = 1024**3
    # TorchTPU under a libtpu it was not built for read a 127 TiB peak on a 16 GiB chip
    broken = MemoryInfo(used=-1, peak=139 * 1024**4, limit=16 * gib, label="HBM")
    assert (broken.used, broken.peak) == (None, None)
    assert format_memory(broken) == "HBM n/a / 16.0 GiB"
    sane = MemoryInfo(used=gib, peak=2 * gib, limit=16 * gib, label="HBM")
    assert (sane.used, sane.peak) == (gib, 2 * gib)


def run(**changes) -> CellRun:
    base = dict(
        cell=3,
        mode="debug",
        wall_s=1.234,
        peak_bytes=None,
        groups=0,
        cache_hits=0,
        cache_misses=0,
        error=None,
    )
    return CellRun(**{**base, **changes})


def test_a_compile_cell_says_what_it_ran_uncompiled():
    counters = {"ran uncompiled: step of AdamW": 6, "ran uncompiled: function with tensors off the TPU": 1}
    line = cell_summary(run(mode="compile", compiled_graphs=2, counters=counters))
    assert line == (
        "[tpunb] compile · 1.23 s · 2 graphs compiled · "
        "ran uncompiled: 6 steps of AdamW, 1 function with tensors off the TPU"
    )


def test_a_fused_cell_says_which_model_ran_compiled_whole():
    counters = {
        "compiled whole: call of GPT2LMHeadModel": 9,
        "ran uncompiled while compiling: call of GPT2LMHeadModel": 1,
    }
    line = cell_summary(run(mode="fused", counters=counters, cache_hits=4))
    assert line == (
        "[tpunb] fused · 1.23 s · compiled whole: 9 calls of GPT2LMHeadModel · "
        "ran uncompiled while compiling: 1 call of GPT2LMHeadModel · cache 4 hit / 0 miss"
    )


def test_a_fused_cell_says_how_long_it_waited_while_its_model_was_captured():
    counters = {
        "ran uncompiled while compiling: call of GPT2LMHeadModel": 170,
        CAPTURE_WAITED + "GPT2LMHeadModel": 26.53,
    }
    line = cell_summary(run(mode="fused", counters=counters))
    assert line == (
        "[tpunb] fused · 1.23 s · ran uncompiled while compiling: 170 calls of GPT2LMHeadModel · "
        "waited 26.53 s while Dynamo captured GPT2LMHeadModel on this thread"
    )
    quick = {CAPTURE_WAITED + "Net": 0.01}
    assert cell_summary(run(mode="fused", counters=quick)) == "[tpunb] fused · 1.23 s"


def test_a_fused_cell_gives_its_compiled_models_flop_rate_against_the_devices_peak():
    """MFU: the compiled calls' FLOPs over the cell's seconds, against the chip's peak."""
    counters = {"compiled whole: call of GPT2LMHeadModel": 10, MODEL_FLOPS: 0.5 * 197e12 * 1.234}
    line = cell_summary(run(mode="fused", counters=counters, peak_flops=197e12))
    assert line == (
        "[tpunb] fused · 1.23 s · compiled whole: 10 calls of GPT2LMHeadModel · "
        "MFU 50.0 % (98.5 of 197 TFLOP/s)"
    )
    assert cell_summary(run(mode="fused", counters=counters)).endswith(
        " · 98.50 TFLOP/s in compiled model calls"
    )


def test_a_cell_whose_model_compiled_partway_gives_no_mfu():
    """Steps before the compile, or run as captured while it ran, did FLOPs nobody counted: the
    chip measured "MFU 0.2 %" for a 240-step cell whose model compiled at its 225th step."""
    compiled = {"compiled whole: call of GPT2LMHeadModel": 15, MODEL_FLOPS: 0.5 * 197e12 * 1.234}
    before = {**compiled, STEPS_NOT_COMPILED: 224}
    assert "MFU" not in cell_summary(run(mode="fused", counters=before, peak_flops=197e12))
    captured = {**compiled, "ran uncompiled while compiling: call of GPT2LMHeadModel": 1}
    assert "MFU" not in cell_summary(run(mode="fused", counters=captured, peak_flops=197e12))
    assert "MFU 50.0 %" in cell_summary(
        run(mode="fused", counters={**compiled, STEPS_NOT_COMPILED: 0}, peak_flops=197e12)
    )


def test_a_cell_with_a_graph_uncompiled_or_uncounted_gives_no_mfu_and_says_the_first():
    """A graph whose compile failed runs as captured, one whose FLOPs could not be counted adds
    none, and one Dynamo ran as it is (past its limit of versions) ran uncompiled: either way
    the cell's MFU would be too low. The failed compile and the uncompiled calls are in the line."""
    compiled = {"compiled whole: call of GPT2LMHeadModel": 15, MODEL_FLOPS: 0.5 * 197e12 * 1.234}
    partly = {**compiled, "ran partly compiled (a compile failed): call of GPT2LMHeadModel": 3}
    line = cell_summary(run(mode="fused", counters=partly, peak_flops=197e12))
    assert "MFU" not in line
    assert "ran partly compiled (a compile failed): 3 calls of GPT2LMHeadModel" in line, line
    unknown = {**compiled, CALLS_FLOPS_UNKNOWN: 15}
    assert "MFU" not in cell_summary(run(mode="fused", counters=unknown, peak_flops=197e12))
    past = {**compiled, f"{PAST_VERSION_LIMIT}call of GPT2LMHeadModel": 2}
    line = cell_summary(run(mode="fused", counters=past, peak_flops=197e12))
    assert "MFU" not in line
    assert f"{PAST_VERSION_LIMIT}2 calls of GPT2LMHeadModel" in line, line


def test_summary_shows_only_what_is_known_and_non_zero():
    assert cell_summary(run()) == "[tpunb] debug · 1.23 s"  # no "0 groups": nothing fused
    # a compile cell run again reuses its graphs: no "0 graphs compiled"
    assert cell_summary(run(mode="compile", compiled_graphs=0)) == "[tpunb] compile · 1.23 s"
    assert cell_summary(run(mode="fused")) == "[tpunb] fused · 1.23 s"  # a time.sleep cell
    full = cell_summary(
        run(peak_bytes=2 * 1024**2, groups=1, cache_hits=3, cache_misses=1, error="ValueError")
    )
    assert (
        full == "[tpunb] debug · 1.23 s · peak 2.0 MiB · 1 group · cache 3 hit / 1 miss · failed: ValueError"
    )


def group(
    status: str,
    capture_ms: float,
    run_ms: float,
    eager_ms: float | None,
    ops: int = 760,
    whole: bool = False,
    plan: str | None = None,
):
    return FusionGroup(
        key="k",
        ops=ops,
        top_ops={},
        input_shapes=[],
        trigger=".item() at Cell In[4], line 3",
        source="Cell In[4], line 1",
        status=status,
        compile_ms=None,
        run_ms=run_ms,
        lifted=0,
        capture_ms=capture_ms,
        eager_ms=eager_ms,
        whole_call=whole,
        plan=plan,
    )


def test_fused_says_once_for_the_cell_when_recording_costs_more_than_running_the_ops():
    steps = [group("op by op", 20.0, 6.0, 6.0)] + [group("hit", 21.0, 2.0, 6.0) for _ in range(9)]
    note = fused_slower(steps, compiled=False)
    assert note == (
        "fused is slower here: 10 groups spent 209.0 ms recording 7600 ops and 24.0 ms running them; "
        "one by one, as strict mode runs them, they took 60.0 ms. Run this cell in strict mode "
        "(%%tpu_mode strict), or measure compile mode first (%%tpu_profile --mode compile)"
    )
    line = cell_summary(run(mode="fused", groups=10, cache_hits=9, cache_misses=1, slower=note))
    assert line.splitlines() == [
        "[tpunb] fused · 1.23 s · 10 groups · cache 9 hit / 1 miss",
        f"[tpunb] {note}",
    ]


def test_groups_that_ran_op_by_op_count_too_so_a_cold_cell_says_so():
    note = fused_slower([group("op by op", 21.0, 6.0, 6.0), group("miss", 21.0, 6.0, 6.0)], compiled=False)
    assert note is not None and note.startswith("fused is slower here: 2 groups spent 42.0 ms recording")


def test_fused_that_pays_or_has_nothing_to_compare_says_nothing():
    assert fused_slower([group("hit", 2.0, 30.0, 400.0) for _ in range(5)], compiled=False) is None  # pays
    assert (
        fused_slower([group("hit", 21.0, 2.0, None) for _ in range(5)], compiled=False) is None
    )  # never replayed
    assert fused_slower([group("hit", 0.5, 0.1, 0.2, ops=5)], compiled=False) is None  # too small to notice
    assert (
        fused_slower([group("hit", 5.0, 6.0, 10.0)], compiled=False) is None
    )  # within SLOWER_BY of op by op


def test_a_cell_that_compiled_is_not_judged_on_its_time():
    """Its time holds compiles later runs reuse: a ``--sync-compile`` cell's 5.6 s compile was
    reported as 5.6 s of "running" and strict mode recommended."""
    costly = [group("miss", 21.0, 5656.5, 6.0)]
    assert fused_slower(costly, compiled=False) is not None
    assert fused_slower(costly, compiled=True) is None


def test_recorded_first_steps_of_a_cell_whose_model_turned_hot_are_not_judged():
    """The steps recorded while a module turned hot do not come back: its later calls run
    compiled whole, so the recorder's cost on them says nothing about the cell's regime."""
    from tpunb.fuse.groups.plan import WARMING

    warm_up = [group("miss", 21.0, 6.0, 6.0, plan=WARMING) for _ in range(3)]
    hot = [group("hit", 0.0, 2.0, 2.1, ops=0, whole=True) for _ in range(5)]
    assert fused_slower(warm_up + hot, compiled=False) is None
    assert fused_slower([group("miss", 21.0, 6.0, 6.0) for _ in range(3)], compiled=False) is not None


def test_calls_compiled_whole_slower_than_their_eager_runs_say_so_without_a_strict_run():
    """A hot call's row carries its eager runs' median (what strict mode costs it): a cell whose
    compiled calls ran slower than that is told so, with the figures, though the user never
    ran it in strict mode."""
    calls = [group("hit", 0.0, 9.0, 4.0, ops=0, whole=True) for _ in range(10)]
    assert fused_slower(calls, compiled=False) == (
        "fused is slower here: 10 calls compiled whole took 90.0 ms; one by one, as strict mode runs "
        "them, they took 40.0 ms. Run this cell in strict mode (%%tpu_mode strict), or measure "
        "compile mode first (%%tpu_profile --mode compile)"
    )
    assert fused_slower([group("hit", 0.0, 3.0, 4.0, ops=0, whole=True)] * 10, compiled=False) is None


def test_what_fused_added_to_calls_run_as_strict_is_said_once_noticeable():
    """A small model's loop whose calls and steps run as strict mode runs them (their compile
    has not paid off) pays the engine's wrappers every step: said with the measured figures."""
    said = fused_overhead(0.12, 2.0)
    assert said is not None and said.startswith("fused is slower here: its own work around the calls")
    assert "at least 120 ms of this cell's 2.00 s (6%)" in said and "%%tpu_mode strict" in said
    assert fused_overhead(0.04, 0.5) is None  # not noticeable: under 50 ms
    assert fused_overhead(0.12, 10.0) is None  # 1.2 % of the cell: within the noise of a run


def test_a_reduced_precision_cell_names_its_precision_and_a_strict_one_no_groups():
    assert (
        cell_summary(run(mode="fused", precision="bf16", groups=2))
        == "[tpunb] fused · bf16 · 1.23 s · 2 groups"
    )
    assert cell_summary(run(mode="strict", precision="bf16")) == "[tpunb] strict · bf16 · 1.23 s"


def test_a_compile_cell_that_waited_for_background_compiles_says_how_long():
    waited = cell_summary(run(mode="compile", compiled_graphs=2, compile_waited_s=1.5))
    assert waited == (
        "[tpunb] compile · 1.23 s · 2 graphs compiled"
        " · waited 1.50 s for fused groups compiling in the background"
    )
    assert "waited" not in cell_summary(run(mode="compile", compiled_graphs=2, compile_waited_s=0.01))


def test_a_graph_break_is_named_with_its_reason():
    broke = cell_summary(run(mode="compile", compiled_graphs=2, graph_breaks=1, break_reasons="print"))
    assert broke == "[tpunb] compile · 1.23 s · 2 graphs compiled · 1 graph break (print)"


def test_a_mode_is_recommended_only_when_the_session_measured_it_faster_on_the_same_code():
    times = CellTimes()
    code = "for step in range(100):\n    total += float(x.sum())"
    times.record(code, "fp32", "strict", 1.0, 2)
    times.record("%%tpu_mode compile\n" + code, "fp32", "compile", 5.0, 3)  # measured slower
    note = times.slower_than_seen(
        "%%tpu_mode fused --sync-compile\n" + code, "fp32", "fused", 3.0, compiled=False
    )
    assert note == (
        "fused is slower here: this cell took 3.00 s; strict mode ran the same code in 1.00 s (In[2]). "
        "Run it in strict mode (%%tpu_mode strict)"
    )
    times.record("%%tpu_mode compile\n" + code, "fp32", "compile", 0.5, 4)  # measured again, faster
    faster = times.slower_than_seen(code, "fp32", "fused", 3.0, compiled=False)
    assert faster is not None and "compile mode ran the same code in 0.50 s (In[4])" in faster
    assert (
        times.slower_than_seen(code, "fp32", "fused", 0.55, compiled=False) is None
    )  # within SLOWER_BY of the best
    assert (
        times.slower_than_seen(code, "bf16", "fused", 3.0, compiled=False) is None
    )  # another precision: not measured
    assert (
        times.slower_than_seen(code, "fp32", "debug", 30.0, compiled=False) is None
    )  # debug is slow on purpose
    assert times.slower_than_seen("other code", "fp32", "fused", 3.0, compiled=False) is None


def test_a_run_that_compiled_is_not_judged_against_a_faster_mode_yet():
    """A cell's first run in fused or compile mode holds compiles its later runs reuse (a
    3000-step GPT loop: fused 21 s, strict 11 s, fused again 9.6 s): it says so rather than
    recommend the other mode on that run's time."""
    times = CellTimes()
    code = "for step in range(3000):\n    train_step()"
    times.record(code, "fp32", "strict", 11.0, 2)
    note = times.slower_than_seen("%%tpu_mode fused\n" + code, "fp32", "fused", 21.0, compiled=True)
    assert note == (
        "fused is slower here: this cell took 21.00 s; strict mode ran the same code in 11.00 s (In[2]). "
        "This run compiled what later runs of it reuse: time one before choosing strict mode"
    )
    again = times.slower_than_seen("%%tpu_mode fused\n" + code, "fp32", "fused", 21.0, compiled=False)
    assert again is not None and again.endswith("Run it in strict mode (%%tpu_mode strict)")
