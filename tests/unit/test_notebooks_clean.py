"""Bundled notebooks are committed without outputs, so diffs stay readable and nbval
compares nothing by accident (the one rule; CI runs them under ``--nbval-lax``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path):
    notebook = json.loads(path.read_text())
    dirty = [
        i
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code" and (cell["outputs"] or cell["execution_count"] is not None)
    ]
    assert not dirty, f"{path.name}: clear the outputs of cells {dirty} before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_nbformat_with_cell_ids(path):
    """nbformat 4.5 gives every cell an id; a reader that finds one missing adds it, and
    JupyterLab then opens the notebook as modified."""
    import nbformat

    cells = json.loads(path.read_text())["cells"]  # as written (nbformat.read adds missing ids)
    assert not [i for i, cell in enumerate(cells) if "id" not in cell], f"{path.name}: cells without an id"
    nbformat.validate(nbformat.read(path, as_version=4))
