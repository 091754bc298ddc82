"""Installed package versions, read from metadata: importing a TPU package to ask its version
can grab the chip (or fail on a mismatched torch), so nothing here imports one."""

from __future__ import annotations

import importlib.metadata
import re


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """``2.9.0+cpu`` -> (2, 9, 0): the part torch and torch_xla must agree on."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in match.group(0).split(".")) if match else ()


def torch_xla_mismatch(torch: str | None, xla: str | None) -> str | None:
    """Why these torch and torch_xla versions cannot work together, or None. torch_xla's wheel
    does not declare torch, so ``pip install torch_xla`` beside another torch gives an
    undefined-symbol ImportError; this says what to install instead."""
    if not torch or not xla or release(torch)[:3] == release(xla)[:3]:
        return None
    wanted = ".".join(str(n) for n in release(xla)[:3])
    return (
        f"torch {torch} and torch_xla {xla} must be the same release: "
        f"pip install torch=={wanted} 'torch_xla[tpu]=={wanted}'"
    )


def required_by(distribution: str, dependency: str) -> str | None:
    """The version specifier ``distribution`` declares for ``dependency`` (``>=0.0.50`` for
    torch_tpu's libtpu), or None where it is not installed or declares none."""
    from packaging.requirements import Requirement

    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name.lower() == dependency.lower() and requirement.marker is None:
            return str(requirement.specifier) or None
    return None
