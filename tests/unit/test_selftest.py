"""``tpunb doctor --selftest``: every mode run for real, and what a failed check reports."""

from __future__ import annotations

import json

from test_doctor import DOCUMENTED_KEYS, doctor

from tpunb.selftest import FAIL, SelfTest, SelfTestFailure, _Check, _run, format_selftest
from tpunb.session import get_session

CHECK_NAMES = ["debug", "strict", "fused", "compile", "memory", "cache dir"]


def test_selftest_runs_every_mode_on_the_native_runtime(tmp_path):
    result = doctor("--selftest", "--json", TPUNB_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {*DOCUMENTED_KEYS, "selftest"}
    selftest = report["selftest"]
    assert selftest["ok"] is True and selftest["runtime"] == "native" and selftest["device"] == "cpu"
    steps = {step["name"]: step for step in selftest["steps"]}
    assert list(steps) == CHECK_NAMES
    assert all(step["status"] == "ok" and not step["fix"] for step in steps.values()), steps
    assert "at its line" in steps["debug"]["detail"]
    assert "equal strict" in steps["fused"]["detail"] and "cache hits" in steps["fused"]["detail"]
    assert str(tmp_path) in steps["cache dir"]["detail"]


def test_selftest_without_a_runtime_says_why_it_did_not_run():
    result = doctor("--selftest", TPUNB_RUNTIME="quantum")
    assert result.returncode == 1
    assert "self-test not run: no runtime to run it on" in result.stdout and "'quantum'" in result.stdout


def test_a_failed_check_names_what_was_seen_and_what_to_do():
    def wrong(session):
        raise SelfTestFailure("losses [1, 2] differ from strict's [1, 3]")

    def broken(session):
        return {}["missing"]

    session = get_session()
    seen = _run(_Check("fused", wrong, "use strict for now"), session)
    crashed = _run(_Check("compile", broken, "report it"), session)
    assert (seen.status, seen.fix) == (FAIL, "use strict for now")
    assert seen.detail == "losses [1, 2] differ from strict's [1, 3]"
    assert crashed.status == FAIL and crashed.detail.startswith("KeyError: 'missing' (test_selftest.py:")
    table = format_selftest(SelfTest("native", "cpu", [seen, crashed]))
    assert "fail  fused" in table and "  fused: use strict for now" in table
    assert table.endswith("s)") and "problems found" in table
