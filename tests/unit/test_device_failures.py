"""Device failures in the user's terms: TorchTPU's texts (as a v5e printed them), what is lost,
which cells make it again. (The chip-side half, restoring and finding lost tensors on a real
TPU: tests/tpu/test_tpu_failures.py.)"""

from __future__ import annotations

import torch

from tpunb.device_failures import Lost, classify, defining_cells, find_lost, remake_advice

#: What TorchTPU 0.2.0 raised on a TPU v5e, cut to the lines that matter.
COMPILE_TIME_OOM = (
    "local_scalar_dense(): the TPU ran out of memory while awaiting the materialization of value "
    "float32[]:\nfailed to compile MLIR module -- the XLA compiler failed with: e1000: CompileTimeHbmOom: "
    "Ran out of memory on HBM, the total memory required for HLO temporaries (20.00G) exceeds available "
    "HBM (15.75G). HLO module: tt_jit_sum."
)
RUN_TIME_OOM = (
    "local_scalar_dense(): the TPU ran out of memory while awaiting the materialization of value "
    "float32[]:\nfailed to enqueue execution for task_name=anonymous: failed to run executable -- the XLA "
    "compiler failed with: e0100: RuntimeBufferAllocationFailure:\nError allocating device buffer: "
    "Attempting to allocate 1.00G. That was not possible. There are 765.65M free.; (0x0x0_HBM0)"
)
USED_A_LOST_VALUE = "execute(): a required argument is in a failed state"


def test_out_of_memory_is_told_with_its_figures():
    at_compile = classify(RuntimeError(COMPILE_TIME_OOM))
    assert at_compile.out_of_memory
    assert at_compile.detail == "it needs 20.00G for its temporaries; the chip has 15.75G"
    at_run = classify(RuntimeError(RUN_TIME_OOM))
    assert at_run.out_of_memory and at_run.detail == "it needed 1.00G more while 765.65M were free"


def test_a_use_of_a_lost_value_is_its_own_kind_and_the_users_errors_are_not_the_devices():
    assert classify(RuntimeError(USED_A_LOST_VALUE)).kind == "a failed computation"
    assert classify(ValueError("shapes (3,) and (4,) do not match")) is None
    assert classify(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")) is None


def test_the_variables_holding_lost_tensors_are_found_whatever_holds_them():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    poisoned = {id(t) for t in (model.weight, model.bias, *optimizer.state[model.weight].values())}
    namespace = {"model": model, "opt": optimizer, "x": torch.ones(2), "_hidden": model, "n": 3}
    lost = find_lost(namespace, lambda t: id(t) in poisoned, "cpu")
    assert lost.names == {"model": 2, "opt": 3}  # step, exp_avg and exp_avg_sq of the weight
    assert lost.words() == "model (2 tensors), opt (3 tensors)"
    assert not find_lost(namespace, lambda t: id(t) in poisoned, "tpu")  # only the device's tensors


def test_the_cells_that_make_lost_variables_are_named_from_the_history():
    history = [
        "",
        "import torch",
        "model = build()\nopt = torch.optim.AdamW(model.parameters())",
        "get_ipython().run_cell_magic('tpu_mode', 'fused', 'for x in data:\\n    opt.step()\\n')",
        "get_ipython().run_cell_magic('tpu_mode', 'strict', 'model = build()\\n')",
    ]
    assert defining_cells(["model", "opt"], history) == {2: ["opt"], 4: ["model"]}
    advice = remake_advice(Lost({"model": 4, "opt": 8}), history, current=5)
    assert advice == ". Re-create them: run In[2] (opt); In[4] (model) again"
    assert remake_advice(Lost({"w": 1}), None, current=5).startswith(". Re-create them (run the cells")
    # a value the failing cell made itself: its own code is what to change
    assert remake_advice(Lost({"model": 4}), history, current=4) == ""
