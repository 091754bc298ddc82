"""Repeated groups fold into one row each: a training loop is a handful of monitor rows."""

from __future__ import annotations

from dataclasses import replace

from test_report import group

from tpunb.events import CompileDone, EventBus
from tpunb.group_rows import GroupRows
from tpunb.monitoring.state import GROUPS_SHOWN, format_text


def folded_bus() -> tuple[EventBus, GroupRows]:
    bus, fold = EventBus(), GroupRows()
    bus.subscribe(fold.observe)
    return bus, fold


def test_a_loops_flushes_fold_into_one_row_per_group_with_counts_and_the_latest_record():
    bus, fold = folded_bus()
    step, logging = (
        replace(group("op by op", 1.0, 2.0, None), key="step"),
        replace(group("op by op", 1.0, 1.0, None), key="log"),
    )
    bus.publish(step)
    for n in range(853):
        bus.publish(replace(step, status="hit", run_ms=float(n), time=1000.0 + n))
        if n % 100 == 0:
            bus.publish(replace(logging, time=1000.0 + n))
    rows = fold.rows(now=2000.0, limit=GROUPS_SHOWN)
    assert [(r["key"], r["count"], r["status"]) for r in rows] == [
        ("step", 854, "hit"),
        ("log", 9, "op by op"),
    ]
    assert rows[0]["run_ms"] == 852.0  # the latest run's times


def test_a_background_compile_shows_how_long_it_has_run_until_it_is_done():
    bus, fold = folded_bus()
    for n in range(5):
        bus.publish(replace(group("compiling", 1.0, 2.0, None), key="step", time=100.0 + n))
    (row,) = fold.rows(now=108.25, limit=GROUPS_SHOWN)
    assert (row["status"], row["count"], row["compiling_s"]) == ("compiling", 5, 8.2)
    bus.publish(CompileDone(key="step", ok=True, compile_ms=8000.0, error=None))
    (row,) = fold.rows(now=109.0, limit=GROUPS_SHOWN)
    assert row["status"] == "compiled" and row["compile_ms"] == 8000.0 and "compiling_s" not in row
    bus.publish(replace(group("hit", 1.0, 2.0, None), key="step", time=110.0))
    assert fold.rows(now=111.0, limit=GROUPS_SHOWN)[0]["count"] == 6


def test_the_text_snapshot_shows_counts_and_compile_time():
    bus, fold = folded_bus()
    for n in range(3):
        bus.publish(replace(group("compiling", 1.0, 2.0, None), key="step", time=100.0 + n))
    rows = fold.rows(now=104.0, limit=GROUPS_SHOWN)
    state = {
        "runtime": "native",
        "device": "cpu",
        "mode": "fused",
        "precision": "bf16",
        "memory": None,
        "groups": rows,
        "groups_total": 3,
        "last_recompile": None,
        "cache": {"requests": 0, "hits": 0, "misses": 0, "compiles": 0},
    }
    assert "compiling 4.0 s ×3 " in format_text(state)
    assert format_text(state).startswith("tpunb monitor · native on cpu · mode fused · bf16\n")


def test_last_compile_counts_a_call_compiled_whole_in_the_call_as_the_cache_does():
    from types import SimpleNamespace

    from tpunb.monitoring.state import MonitorState

    bus = EventBus()
    state = MonitorState(SimpleNamespace(bus=bus))  # it reads the session's bus alone
    assert state._last_compile() is None
    bus.publish(CompileDone(key="chain", ok=True, compile_ms=900.0, error=None))
    whole = replace(group("miss", 1.0, 2.0, None), key="Sequential-training", compile_ms=1366.9)
    bus.publish(whole)  # compiled in its call: no CompileDone record, a row with its compile time
    assert state._last_compile() == {"key": "Sequential-training", "ok": True, "compile_ms": 1366.9}
