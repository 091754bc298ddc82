"""Compile mode's cell-to-function rewrite (the compiled runs are kernel tests)."""

from __future__ import annotations

import ast

import pytest

from tpunb.cellcompile import CellCompiler, CompileModePrefix, NotCompilable, cell_function


def build(source: str, namespace: dict) -> tuple:
    return cell_function(ast.parse(source), "<cell>", namespace)


def test_assigned_names_become_globals_and_the_last_expression_is_returned():
    namespace = {"base": 10}
    function, names = build(
        "import math as m\nvalue = base + 1\nfor i in range(2):\n    value += i\n"
        "def helper():\n    local = 1\n    return local\nclass Box: pass\nvalue * 2",
        namespace,
    )
    assert names == ["m", "value", "i", "helper", "Box"]  # not `local`: it is helper's own
    assert function() == 24
    assert namespace["value"] == 12 and namespace["i"] == 1 and namespace["helper"]() == 1
    assert "__tpunb_cell__" not in namespace


@pytest.mark.parametrize("source", ["return 1", "yield 2", "from os import *", "await thing()"])
def test_cells_that_cannot_be_functions_say_why(source):
    with pytest.raises(NotCompilable):
        build(source, {})


def test_the_default_mode_prefix_leaves_magics_and_other_modes_alone():
    mode = {"value": "strict"}
    prefix = CompileModePrefix(lambda: mode["value"])
    assert prefix(["x = 1\n"]) == ["x = 1\n"]
    mode["value"] = "compile"
    assert prefix(["x = 1\n"]) == ["%%tpu_mode compile\n", "x = 1\n"]
    assert prefix(["%tpu_mode strict\n"]) == ["%tpu_mode strict\n"]
    assert prefix(["!ls\n"]) == ["!ls\n"]
    with prefix.suspended():
        assert prefix(["x = 1\n"]) == ["x = 1\n"]


def test_a_compiled_cell_first_waits_for_background_compiles_and_its_record_says_how_long():
    records, order = [], []

    def wait() -> float:
        order.append("waited")
        return 1.25

    def compile_fn(function):
        def run():
            order.append("ran")
            return function()

        return run

    compiler = CellCompiler(compile_fn, records.append, wait=wait)
    namespace: dict = {}
    compiler.run(ast.parse("x = 41 + 1"), "x = 41 + 1", "<cell>", namespace, cell=7)
    assert namespace["x"] == 42 and order == ["waited", "ran"]
    assert records[-1].waited_ms == pytest.approx(1250.0) and records[-1].cell == 7


def test_the_optimizers_own_graph_breaks_are_named_as_such():
    """torch.optim's step() calls torch._dynamo.graph_break() twice; Dynamo's reason for that is
    "User-inserted graph break", which the user did not write."""
    import torch

    from tpunb.cellcompile import OPTIMIZER_BREAK, _breaks, _new_breaks

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()

    before = _breaks()
    torch.compile(step, backend="eager")()
    breaks = _new_breaks(before, _breaks())
    assert breaks.get(OPTIMIZER_BREAK) == 2, breaks
