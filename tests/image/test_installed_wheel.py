"""tpunb installed from its wheel into a TPU image's package set leaves the image alone.

The runtime venvs (``make test-colab``, ``test-kaggle``, ``test-torchtpu``) are built the way a
user's runtime is: the image's packages first, recorded in ``image.txt`` before tpunb comes,
then ``pip install`` of tpunb's wheel (not editable) with its dependencies. A dependency
bound that pip could only meet by replacing the image's torch, torch_xla or ipykernel would
break the user's runtime, so these are compared with the record.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import tpunb

#: What the images ship and tpunb must never replace.
IMAGE_PACKAGES = ("torch", "torch_xla", "torch_tpu", "jax", "jaxlib", "ipykernel")
IMAGE_RECORD = Path(sys.prefix) / "image.txt"
CHECKOUT = Path(__file__).resolve().parents[2]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def recorded_versions() -> dict[str, str]:
    """``name==version`` lines of the record, by canonical name."""
    pins = (line.split("==", 1) for line in IMAGE_RECORD.read_text().splitlines() if "==" in line)
    return {canonical(name): version.strip() for name, version in pins}


def test_the_images_packages_are_unchanged() -> None:
    recorded = recorded_versions()
    kept = [name for name in IMAGE_PACKAGES if canonical(name) in recorded]
    assert "torch" in kept, f"{IMAGE_RECORD} records no torch"
    now = {name: importlib.metadata.version(name) for name in kept}
    assert now == {name: recorded[canonical(name)] for name in kept}


def test_tpunb_is_the_installed_wheel_not_this_checkout() -> None:
    distribution = importlib.metadata.distribution("tpunb")
    direct_url = distribution.read_text("direct_url.json")
    assert direct_url is None or not json.loads(direct_url).get("dir_info", {}).get("editable")
    installed = Path(tpunb.__file__).resolve()
    assert installed.parent != CHECKOUT / "tpunb", installed
    assert distribution.version == tpunb.__version__


def test_the_wheel_carries_the_monitor_assets() -> None:
    monitoring = Path(tpunb.__file__).parent / "monitoring"
    assert (monitoring / "monitor.js").stat().st_size > 0
    assert (monitoring / "monitor.css").stat().st_size > 0


def test_the_tpunb_command_is_installed_and_runs() -> None:
    command = Path(sys.executable).parent / "tpunb"
    report = subprocess.run([command, "doctor", "--json"], capture_output=True, text=True, timeout=300)
    versions = json.loads(report.stdout)["versions"]
    assert versions["tpunb"] == tpunb.__version__
    assert versions["torch"] == importlib.metadata.version("torch")
