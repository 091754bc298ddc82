"""``tpunb.compile``: torch.compile with tpunb's reporting (new graphs, recompiles, storms)."""

from __future__ import annotations

import time

import pytest
import torch

import tpunb
from tpunb.cellcompile import explain_guard


def test_guard_failures_read_as_words():
    assert explain_guard("0/0: tensor 'x' size mismatch at index 0. expected 64, actual 17") == (
        "x.shape[0] changed 64 → 17"
    )
    assert explain_guard("tensor 'G['batch']' size mismatch at index 1. expected 8, actual 9") == (
        "batch.shape[1] changed 8 → 9"
    )
    assert explain_guard("0/1: ___check_obj_id(lr, 1234)") == (
        "lr is not the object it was compiled for (its identity is guarded)"
    )
    retyped = "8/1: ___check_type_id(self, 9478), type=<class '__main__.GPT'>  # x = self.tok(i)"
    assert explain_guard(retyped) == (
        "self's class is not the one it was compiled for (a re-run script defines it anew)"
    )
    backend = (
        "0/0: BACKEND_MATCH failure: torch.compile detected different backend callables. Cached backend: x"
    )
    assert explain_guard(backend).startswith("compiled before with another compiler")


def test_compiled_functions_report_graphs_and_recompiles():
    def scaled_sum(x):
        return (x * 2).sum()

    compiled = tpunb.compile(scaled_sum)
    assert compiled(torch.ones(64, 3)).item() == 384.0
    first = tpunb.stats()["compiled"][-1]
    assert first["key"].endswith("scaled_sum") and first["graphs"] == 1
    before = len(tpunb.stats()["compiled"])
    compiled(torch.ones(64, 3))  # warm: nothing compiled, nothing published
    assert len(tpunb.stats()["compiled"]) == before
    compiled(torch.ones(17, 3))
    assert tpunb.stats()["compiled"][-1]["recompile_reasons"] == ["x.shape[0] changed 64 → 17"]


def test_a_recompile_storm_warns_once_with_the_fixes():
    def cubed(x):
        return x**3

    compiled = tpunb.compile(cubed, dynamic=False)
    with pytest.warns(
        RuntimeWarning, match=r"recompiled 5 times; last because x.shape\[0\] changed"
    ) as caught:
        for size in range(1, 9):
            compiled(torch.ones(size))
    assert len([w for w in caught if "recompiled" in str(w.message)]) == 1
    assert "mark_dynamic" in str(caught[0].message)


def test_modules_compile_too():
    model = torch.nn.Linear(4, 2)
    compiled = tpunb.compile(model)
    torch.testing.assert_close(compiled(torch.ones(3, 4)), model(torch.ones(3, 4)))
    assert tpunb.stats()["compiled"][-1]["graphs"] >= 1


def test_compiled_functions_run_while_a_fused_group_compiles_in_the_background():
    """A fused loop's second sighting of a group compiles it on the worker thread. A
    torch.compile'd function called meanwhile used to fail now and then ("Detected that you
    are using FX to symbolically trace a dynamo-optimized function": FX's tracing flag is
    process-wide); new compiles used to collide with the group's. Here both happen for as long
    as the group compiles, and every call must return the right value."""
    from tpunb.session import get_session

    bus = get_session().bus
    compiled = torch.compile(lambda t: (t.sin() * 2).sum(), backend="aot_eager")
    t = torch.randn(16)
    expected = (t.sin() * 2).sum()
    calls = 0
    for trial in range(3):
        x = torch.randn(1200, 30 + trial)  # not tiny: a tiny group never compiles (config.TINY_OPS)
        compiles_before = bus.count("compile")
        with tpunb.mode("fused"):
            for _ in range(2):
                (torch.tanh(x * 2 + 1) * 1.5).sum().item()
        deadline = time.monotonic() + 120
        while bus.count("compile") == compiles_before:  # the group is compiling now
            torch.testing.assert_close(compiled(t), expected)
            calls += 1
            assert time.monotonic() < deadline, "the group's compile never finished"
        fresh = torch.compile(lambda v, k=trial: (v * k).sum(), backend="aot_eager", fullgraph=True)
        assert fresh(torch.ones(3)).item() == 3.0 * trial
    assert calls > 0


def test_a_frames_recompile_is_told_by_its_newest_new_failure_not_a_version_failing_again():
    from tpunb.recompiles import _telling_guard

    reasons = [
        "8/0: GLOBAL_STATE changed: grad_mode",
        "8/1: GLOBAL_STATE changed: grad_mode",
        "8/0: ___check_type_id(self, 9478), type=<class '__main__.GPT'>",
        "8/0: GLOBAL_STATE changed: grad_mode",  # the no-grad version, failing as before
    ]
    assert _telling_guard(reasons, 1) == reasons[2]
    assert _telling_guard(["1/0: lr == 0.1", "1/1: lr == 0.05"], 0) == "1/1: lr == 0.05"
