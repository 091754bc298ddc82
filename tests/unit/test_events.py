from __future__ import annotations

import threading

from tpunb.events import EventBus, FusionGroup, GroupStatus, ModeChange


def change(i: int) -> ModeChange:
    return ModeChange(previous="strict", current=f"m{i}", source="test")


def test_history_is_bounded_but_counts_are_not():
    bus = EventBus(history=3)
    for i in range(5):
        bus.publish(change(i))
    assert [r.current for r in bus.recent("mode")] == ["m2", "m3", "m4"]
    assert [r.current for r in bus.recent("mode", 2)] == ["m3", "m4"]
    assert bus.recent("mode", 0) == []
    assert bus.count("mode") == 5
    assert bus.recent("group") == []


def test_records_become_plain_dicts():
    record = change(1).as_dict()
    assert record["kind"] == "mode" and record["current"] == "m1" and "time" in record


def test_a_failing_subscriber_is_dropped_and_others_still_run():
    bus, seen = EventBus(), []

    def broken(record):
        raise RuntimeError("view bug")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    bus.publish(change(1))
    bus.publish(change(2))
    assert len(seen) == 2


def test_publishing_from_many_threads_loses_nothing():
    bus = EventBus(history=10_000)
    threads = [
        threading.Thread(target=lambda: [bus.publish(change(i)) for i in range(500)]) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bus.count("mode") == 2000 and len(bus.recent("mode")) == 2000


def test_every_group_status_is_plain_json_and_styled_by_the_monitor():
    """One vocabulary: what runtimes write, views read; the monitor's script styles a row by
    its status (monitor.js: ``tpunb-status-`` and the status, spaces as dashes)."""
    import json
    from pathlib import Path

    import tpunb.monitoring

    css = (Path(tpunb.monitoring.__file__).parent / "monitor.css").read_text()
    for status in GroupStatus:
        assert f".tpunb-status-{status.value.replace(' ', '-')} " in css, status
    group = FusionGroup(
        key="k", ops=1, top_ops={}, input_shapes=[], trigger="t", source="s",
        status=GroupStatus.COMPILE_FAILED, compile_ms=None, run_ms=0.0, lifted=0,
    )  # fmt: skip
    assert json.loads(json.dumps(group.as_dict()))["status"] == "compile failed"
