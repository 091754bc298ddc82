"""What compiling cost a fused cell's steps, measured against its own steps before the capture
(fuse/hot/step_clock.py), and the summary's words for it (advice.py)."""

from __future__ import annotations

import pytest

from tpunb.advice import fused_compile_cost
from tpunb.fuse.hot.step_clock import BASELINE_STEPS, BASELINE_WINDOW, StepClock


def steps(clock: StepClock, start: float, *seconds: float) -> float:
    """Optimizer steps from ``start`` (a step that starts then), each taking ``seconds``;
    returns when the last one ended (the next one starts)."""
    now = start
    clock.stepped(now)
    for taken in seconds:
        now += taken
        clock.stepped(now)
    return now


def test_steps_after_a_capture_count_what_they_took_over_the_steps_before_it():
    clock = StepClock()
    now = steps(clock, 0.0, *[0.010] * BASELINE_STEPS, 0.012)  # strict's steps: 10 ms median
    clock.captured()
    steps(clock, now, 1.5, 0.030, 0.008)  # the capture's step, one beside the worker, a fast one
    assert clock.compile_cost_s == pytest.approx(1.49 + 0.020)


def test_without_enough_steps_before_the_capture_nothing_is_counted():
    clock = StepClock()
    now = steps(clock, 0.0, *[0.010] * (BASELINE_STEPS - 1))
    clock.captured()
    steps(clock, now, 2.0, 2.0)
    assert clock.compile_cost_s == 0.0


def test_a_new_cell_starts_its_own_baseline_and_its_first_step_times_nothing():
    clock = StepClock()
    now = steps(clock, 0.0, *[0.010] * BASELINE_STEPS)
    clock.captured()
    clock.begin_cell()
    now = steps(clock, now + 60.0, *[0.020] * BASELINE_STEPS)  # the gap between cells is no step
    clock.captured()
    steps(clock, now, 0.025)
    assert clock.compile_cost_s == pytest.approx(0.005)


def test_the_summary_names_the_compiles_cost_once_it_is_noticeable():
    assert fused_compile_cost(0.01, 3.0) is None  # too small to say
    assert fused_compile_cost(0.3, 3.0) is None  # within what fused's own noise is
    said = fused_compile_cost(5.78, 8.71)
    assert said is not None
    assert "compiling took 5.78 s of this cell's 8.71 s" in said and "about 2.93 s" in said


def test_only_the_last_steps_before_the_capture_are_kept_for_its_baseline():
    """A long cell that has not captured keeps a window of its steps, not all of them."""
    clock = StepClock()
    now = steps(clock, 0.0, *[1.0] * 200, *[0.010] * BASELINE_WINDOW)
    clock.captured()
    steps(clock, now, 0.030)
    assert clock.compile_cost_s == pytest.approx(0.020)
