"""Markers by folder: each test group is named after the real part it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

GROUPS = ("unit", "kernel", "browser", "notebooks")


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
