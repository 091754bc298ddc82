"""Runs one bundled notebook's code cells in this process's IPython, in order, as its kernel would.

    python tests/tpu/notebook_cells.py NAME REPORT.json

The hardware suite starts one such process per notebook: a Jupyter kernel cannot start on the TPU
machine (ipykernel binds a TCP loopback socket for its output pipes, and TCP is closed there), and
a fresh process gives each notebook a fresh shell and the chip to itself. The report holds each
code cell's first line, seconds, the lines tpunb printed, the end of what it printed, and the
error that stopped the notebook; it is written after each cell.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).parent))

from cells import Cells

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def main(name: str, report: str) -> int:
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    shell = Cells()
    rows, error = [], None
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        ran = shell.run(cell.source)
        rows.append(
            {
                "source": cell.source.splitlines()[0][:60] if cell.source else "",
                "seconds": round(ran.seconds, 2),
                "tpunb": [line for line in ran.output.splitlines() if line.startswith("[tpunb] ")],
                "printed": ran.output[-600:],  # the cell's own figures (accuracies, tokens/s)
            }
        )
        if ran.error is not None:
            error = f"{type(ran.error).__name__}: {ran.error}\n{ran.output[-3000:]}"
        # after every cell: a notebook stopped by a time limit still leaves the cells it ran
        Path(report).write_text(json.dumps({"notebook": name, "cells": rows, "error": error}, indent=1))
        if error:
            break
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
