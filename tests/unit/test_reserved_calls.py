"""A library calling an API TorchTPU keeps to torch is named, with the fix. The text is
torch_tpu 0.2.0's, as transformers 5.17's ``TrainingArguments()`` raised it on a v5e; a package
on sys.path raises it here (tests/torchtpu has the real guard)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tpunb.reserved_calls import reserved_call_advice, told

GUARD = (
    "is_available is internal to TorchTPU and can only be called by the PyTorch framework (torch and "
    "torch_tpu). Use torch.accelerator.is_available instead."
)


def raised_from(package: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> RuntimeError:
    """The guard's error as it reaches a cell: raised inside ``package``'s code."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text(f"def setup():\n    raise RuntimeError({GUARD!r})\n")
    monkeypatch.syspath_prepend(str(root))
    module = importlib.import_module(package)
    try:
        module.setup()
    except RuntimeError as error:
        return error
    raise AssertionError("the package did not raise")


def test_the_library_that_called_a_reserved_api_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = raised_from("oldtrainer", tmp_path, monkeypatch)
    assert reserved_call_advice(error) == [
        "oldtrainer ? called torch.tpu.is_available, which torch_tpu keeps to torch itself: "
        "a newer oldtrainer may ask torch.accelerator instead (pip install -U oldtrainer)"
    ]
    sys.modules.pop("oldtrainer")


def test_transformers_before_5_20_is_told_the_release_that_fixed_it() -> None:
    assert told("torch.tpu.is_available", "transformers", "5.17.0") == (
        "transformers 5.17.0 called torch.tpu.is_available, which torch_tpu keeps to torch itself; "
        "transformers >= 5.20 asks torch.accelerator instead: pip install -U 'transformers>=5.20'"
    )
    assert "may ask" in told("torch.tpu.is_available", "transformers", "5.20.0")  # fixed there: not this


def test_other_errors_get_no_advice() -> None:
    assert reserved_call_advice(RuntimeError("CUDA out of memory")) == []
