"""A device failure on the chip is explained and recovered from: an out-of-memory names its
figures and what to try; values lost with a failed computation are named with the cells that
make them again; the device keeps working (new tensors, the random generator) without a
restart. These tests break the device on purpose: the suite runs them last."""

from __future__ import annotations

from workloads import GPT2_ADAMW

#: 20 GiB of deferred values on a 15.75 GiB chip, with the model's update in the same program.
OVERFLOWING_STEP = """%%tpu_mode fused
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
optimizer.step()
noise = torch.randn(4, device=DEVICE)
waste = [torch.ones(2**28, device=DEVICE) * i for i in range(20)]
total = sum(w[0] for w in waste).item()
"""


def test_an_allocation_larger_than_the_chip_is_told_with_its_figures(cells) -> None:
    ran = cells.run("huge = torch.ones(5 * 2**30, device=DEVICE)\ntotal = huge.sum().item()")
    assert ran.error is not None
    first = ran.notes[0] if ran.notes else ""
    assert first.startswith("[tpunb] the TPU ran out of memory in this cell: it needs"), ran.output
    assert "the chip has" in first and "smaller batch" in first, first
    assert "lost with it: huge (1 tensor)" in ran.notes[1], ran.notes  # made by the failing cell
    cells.ok("after = (torch.ones(3, device=DEVICE) + 1).sum().item()")
    assert cells.value("after") == 6.0


def test_values_lost_with_a_failed_step_are_named_and_remade(cells) -> None:
    cells.ok(GPT2_ADAMW.build)
    built_in = cells.value("len(In) - 1")  # the cell that makes model and optimizer
    ran = cells.run(OVERFLOWING_STEP)
    assert ran.error is not None, ran.output
    assert ran.notes and "ran out of memory" in ran.notes[0], ran.output
    lost = _really_lost(cells)
    named = " ".join(ran.notes)
    for name in lost:  # whatever TorchTPU lost, tpunb names it, and the cell that makes it again
        assert f"{name} (" in named, (lost, ran.notes)
    if {"model", "optimizer"} & set(lost):
        assert f"In[{built_in}]" in named, ran.notes
    if lost:
        used = cells.run(f"again = {READ[lost[0]]}.sum().item()")
        assert used.error is not None
        assert any("lost when Cell In[" in note for note in used.notes), used.output
    cells.ok("fresh = torch.randn(3, device=DEVICE).cpu()")  # the generator draws again
    cells.ok(GPT2_ADAMW.build)  # made again, as the note says
    cells.ok(GPT2_ADAMW.train)
    assert cells.value("losses[-1] < losses[0]")


#: A tensor each variable holds, to use it.
READ = {
    "model": "next(model.parameters())",
    "optimizer": "next(x for s in optimizer.state.values() for x in s.values() if torch.is_tensor(x))",
    "noise": "noise",
}


def _really_lost(cells) -> list[str]:
    """The variables whose tensors fail to read, found without tpunb."""
    cells.ok(
        "def _fails(t):\n"
        "    try:\n        t.detach().flatten()[:1].cpu(); return False\n"
        "    except RuntimeError:\n        return True\n"
        "_lost = [n for n, v in [('model', model), ('optimizer', optimizer), ('noise', noise)]\n"
        "         if any(_fails(t) for t in (v.parameters() if n == 'model' else\n"
        "                [x for s in v.state.values() for x in s.values() if torch.is_tensor(x)]"
        " if n == 'optimizer' else [v]))]"
    )
    return cells.value("_lost")
