"""Debug mode on the chip: a NaN or Inf is stopped at the op and line it was born on, forward or
backward, with its checks gathered into a few device reads a step (debug_batch.py); an index
out of bounds is named before the op runs."""

from __future__ import annotations

import re
import time

from workloads import GPT2_ADAMW

STEP = """
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
optimizer.step()
optimizer.zero_grad()
seen = loss.item()
"""


def failed(cells, code: str) -> str:
    ran = cells.run(f"%%tpu_mode debug\n{code}")
    assert ran.error is not None and type(ran.error).__name__ == "DebugCheckError", ran.output
    return str(ran.error)


def test_a_nan_born_in_the_forward_names_its_op_and_line(cells) -> None:
    message = failed(
        cells, "v = torch.tensor([-1.0, 4.0], device=DEVICE)\nw = torch.log(v) * 2\ntotal = w.sum().item()"
    )
    assert message.startswith("aten.log produced NaN from inputs without NaN"), message
    assert re.search(r"line 3: w = torch.log\(v\) \* 2", message), message


def test_a_nan_born_in_the_backward_names_the_gradient_and_its_forward_line(cells) -> None:
    code = (
        "a = torch.ones(4, 3, device=DEVICE, requires_grad=True)\n"
        "d = torch.sqrt(((a - a.detach()) ** 2).sum(-1))\n"
        "d.mean().backward()"
    )
    message = failed(cells, code)
    assert "in SqrtBackward0" in message and "line 3: d = torch.sqrt" in message, message


def test_an_in_place_write_after_a_clean_op_is_where_the_nan_is_born(cells) -> None:
    """The checks are deferred: a check of ``b`` taken before ``log_`` wrote into it must read
    the value from before the write, or the NaN would look carried in and pass."""
    message = failed(cells, "b = torch.ones(4, device=DEVICE) * -1\nb.log_()\ntotal = b.sum().item()")
    assert message.startswith("aten.log_ produced NaN") and "line 3: b.log_()" in message, message


def test_an_index_out_of_bounds_is_named_before_it_runs(cells) -> None:
    message = failed(
        cells, "table = torch.nn.Embedding(4, 2).to(DEVICE)\nout = table(torch.tensor([1, 7], device=DEVICE))"
    )
    assert "index 7 is out of bounds for the embedding table (size 4; valid [0, 4))" in message, message


def test_a_debug_step_runs_clean_and_its_cost_is_recorded(cells) -> None:
    """Not a timed assertion: the seconds go to the suite's report (debug against strict)."""
    cells.ok(GPT2_ADAMW.build)
    seconds = {}
    for mode in ("strict", "debug", "strict", "debug"):  # the second of each is warm
        started = time.perf_counter()
        cells.ok(f"%%tpu_mode {mode}\n{STEP}")
        seconds[mode] = time.perf_counter() - started
    cells.record(
        workload="gpt2 step",
        mode="debug",
        seconds=round(seconds["debug"], 3),
        strict_seconds=round(seconds["strict"], 3),
    )
