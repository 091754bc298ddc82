"""The hardware suite: tpunb on a real TPU chip with TorchTPU, every mode, through cells.

It runs wherever a TPU chip and torch_tpu are present (README: Testing on a TPU) and is left
out, with one line in pytest's summary, everywhere else (CI has no chip). All its tests
share one in-process IPython shell: one process holds the chip at a time, opening it costs
10-15 s, and the TPU machine has no TCP for a kernel. Tests that break the device on purpose
run last.

The bundled notebooks (``tpu_notebooks``) are a second command, ``-m tpu_notebooks`` (with
``-k 02_`` and so on for one notebook a run): on a v5e the suite alone takes about 5 minutes and
the three notebooks together once ran past 8, and a command on the TPU machine must fit in 10.
Without that marker in ``-m`` they are deselected.

``TPUNB_TPU_REPORT=PATH`` writes each training cell's mode, precision, seconds and losses
there as JSON (the closing note's tables come from it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cells import Cells

from tpunb.runtimes.detect import installed
from tpunb.runtimes.hardware import scan_tpu

NO_CHIP = "the hardware suite needs a TPU chip and torch_tpu (README: Testing on a TPU)"


def _chip_here() -> bool:
    return installed("torch_tpu") and scan_tpu().chips > 0


#: Modules whose kernels need the chip before this process's shell opens it: they run first.
FIRST = ("test_tpu_notebooks.py",)
#: Modules that break the device on purpose: they run after the rest.
LAST = ("test_tpu_failures.py",)


NOTEBOOKS = "tpu_notebooks"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if NOTEBOOKS not in (config.option.markexpr or ""):
        notebooks = [item for item in items if item.get_closest_marker(NOTEBOOKS)]
        if notebooks:
            config.hook.pytest_deselected(items=notebooks)
            items[:] = [item for item in items if not item.get_closest_marker(NOTEBOOKS)]

    def place(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return 0 if name in FIRST else 2 if name in LAST else 1

    items.sort(key=place)  # stable: the order within each module stays


#: Without a chip the suite is not collected, and the summary says so in one line.
collect_ignore_glob = [] if _chip_here() else ["test_*.py"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if collect_ignore_glob:
        terminalreporter.write_line(f"SKIPPED tests/tpu: {NO_CHIP}")


@pytest.fixture(scope="session")
def report() -> Iterator[list[dict[str, Any]]]:
    """The figures tests keep (cells' seconds and losses); written to TPUNB_TPU_REPORT at the end."""
    rows: list[dict[str, Any]] = []
    yield rows
    path = os.environ.get("TPUNB_TPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))


@pytest.fixture(scope="session")
def cells(report: list[dict[str, Any]]) -> Cells:
    shell = Cells(records=report)
    shell.ok("import torch, tpunb\nDEVICE = tpunb.device()")
    return shell
