"""What a ``%%tpu_distributed`` cell takes from the notebook (no processes started here)."""

from __future__ import annotations

import threading

import cloudpickle
import pytest
import torch

from tpunb.distributed.job import UnpicklableVariables, build_job, free_names


def test_names_assigned_before_they_are_read_are_the_cells_own():
    cell = (
        "for step in range(STEPS):\n"
        "    x, y = batch(step)\n"
        "    loss = model(x).sum()\n"
        "    total = loss + bias\n"
        "import numpy as np\n"
        "print(np.pi, total)\n"
    )
    assert free_names(cell) == {"range", "STEPS", "batch", "model", "bias", "print", "total"}


def test_reads_that_may_come_first_are_sent():
    assert free_names("x = x + 1") == {"x"}  # the value is read before the name is rebound
    assert free_names("if flag:\n    data = 1\nuse(data)") == {"flag", "use", "data"}  # branch may not run
    assert free_names("def f():\n    return scale * w\nw = 2\nf()") == {"scale", "w"}
    assert free_names("with open_it() as handle:\n    handle.read()") == {"open_it"}
    assert free_names("try:\n    v = risky()\nexcept KeyError as e:\n    log(e)\nprint(v)") == {
        "risky",
        "KeyError",
        "log",
        "print",
        "v",
    }


def build(cell: str, namespace: dict) -> object:
    return build_job(
        cell, namespace, first_line=2, filename="Cell In[3]", mode="strict", backend="gloo", returns=()
    )


def test_the_job_sends_values_by_value_and_modules_as_imports():
    import torch.nn.functional as F

    def scaled(t):
        return t * 3

    namespace = {
        "weights": torch.ones(2, 3),
        "F": F,
        "scaled": scaled,
        "factor": 3,
        "unused": object(),
        "_": 1,
    }
    job = build("y = F.relu(scaled(weights))\n", namespace)
    assert job.imports == (("F", "torch.nn.functional"),)
    assert set(cloudpickle.loads(job.variables)) == {"weights", "scaled"}
    assert job.sent == ("scaled (function)", "weights (Tensor[2, 3])", "F (module torch.nn.functional)")
    assert job.source == "\ny = F.relu(scaled(weights))\n"  # line numbers match the notebook cell


def test_values_that_cannot_be_pickled_are_refused_by_name():
    namespace = {"lock": threading.Lock(), "fine": 1}
    with pytest.raises(UnpicklableVariables) as caught:
        build("with lock:\n    print(fine)\n", namespace)
    message = str(caught.value)
    assert message.startswith(
        "%%tpu_distributed: these variables cannot be sent to the workers:\n  lock (lock: "
    )
    assert "fine" not in message and message.endswith(
        "Create them inside the cell instead, or stop using them there."
    )
