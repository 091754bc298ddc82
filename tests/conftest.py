"""Markers by folder: each test group is named after the real part it needs."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

#: The kernels nbval starts (their environment is this one) print every thread's stack when
#: they crash, into the failing notebook's captured output (tpunb_kernels.py does the same).
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

GROUPS = ("unit", "kernel", "browser", "notebooks", "workloads", "xla", "torchtpu", "image", "tpu")

#: Runtime suites that need their own virtual environment (``make test-xla``,
#: ``make test-torchtpu``): collected only where their package is installed.
RUNTIME_SUITES = {"xla": "torch_xla", "torchtpu": "torch_tpu"}

collect_ignore = [
    folder for folder, package in RUNTIME_SUITES.items() if importlib.util.find_spec(package) is None
]
#: The image checks run only in a runtime venv, which records the image before tpunb comes.
if not (Path(sys.prefix) / "image.txt").exists():
    collect_ignore.append("image")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":
            item.add_marker("notebooks")
            continue
        relative = path.relative_to(tests_dir) if path.is_relative_to(tests_dir) else path
        if relative.parts and relative.parts[0] in GROUPS:
            item.add_marker(relative.parts[0])
