"""Runtimes: detection and construction. One module per backend beside this file."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import replace

from tpunb.events import Record
from tpunb.runtimes.base import (
    CALLS_FLOPS_UNKNOWN,
    CAPTURE_WAITED,
    COMPILED_WHOLE,
    CPU_FALLBACK,
    MODEL_FLOPS,
    PARTLY_COMPILED,
    PAST_VERSION_LIMIT,
    STEPS_NOT_COMPILED,
    UNCOMPILED,
    WHILE_COMPILING,
    CacheDirError,
    CacheStats,
    MemoryInfo,
    ModeUnavailable,
    Runtime,
    RuntimeUnavailable,
)
from tpunb.runtimes.detect import RuntimeChoice, detect_runtime, installed

#: Runtime name -> "module:class", imported only when chosen (the TPU packages are optional).
ADAPTERS: dict[str, str] = {
    "native": "tpunb.runtimes.native:NativeRuntime",
    "xla": "tpunb.runtimes.xla:XlaRuntime",
    "torchtpu": "tpunb.runtimes.torchtpu:TorchTpuRuntime",
}

__all__ = [
    "ADAPTERS",
    "CALLS_FLOPS_UNKNOWN",
    "CAPTURE_WAITED",
    "COMPILED_WHOLE",
    "CPU_FALLBACK",
    "MODEL_FLOPS",
    "PACKAGES",
    "PARTLY_COMPILED",
    "PAST_VERSION_LIMIT",
    "STEPS_NOT_COMPILED",
    "UNCOMPILED",
    "WHILE_COMPILING",
    "CacheDirError",
    "CacheStats",
    "MemoryInfo",
    "ModeUnavailable",
    "Runtime",
    "RuntimeChoice",
    "RuntimeUnavailable",
    "create_runtime",
    "detect_runtime",
    "resolve_choice",
]


#: Runtime name -> (the package it needs, the tpunb extra that installs it).
PACKAGES: dict[str, tuple[str, str]] = {
    "native": ("torch", ""),
    "xla": ("torch_xla", "xla"),
    "torchtpu": ("torch_tpu", "tpu"),
}


def resolve_choice(choice: RuntimeChoice) -> RuntimeChoice:
    """The choice, checked without importing anything: a runtime asked for by name whose
    package is missing is an error that says what to install."""
    package, extra = PACKAGES[choice.name]
    if not installed(package):
        command = f"pip install 'tpunb[{extra}]'" if extra else f"pip install {package}"
        raise RuntimeUnavailable(f"{choice.reason}, but {package} is not installed: {command}")
    return choice


def create_runtime(
    choice: RuntimeChoice | None = None, publish: Callable[[Record], None] | None = None
) -> tuple[Runtime, RuntimeChoice]:
    """Build the runtime for ``choice`` (detected when None); it publishes records to ``publish``.

    A TPU runtime that fails to start (a torch/torch_xla mismatch, say) is an error when it
    was asked for by name; when it was only detected, the kernel falls back to native with a
    warning, so a broken TPU install never costs the notebook its kernel."""
    resolved = resolve_choice(choice if choice is not None else detect_runtime())
    try:
        return _construct(resolved.name, publish), resolved
    except (ImportError, RuntimeUnavailable) as error:
        problem = f"{resolved.reason}, but the {resolved.name} runtime failed to start: {error}"
        if resolved.explicit or resolved.name == "native":
            raise RuntimeUnavailable(problem) from error
        warnings.warn(f"tpunb: {problem}; using native", RuntimeWarning, stacklevel=2)
        fallback = replace(resolved, name="native", reason=f"{problem}: native")
        return _construct("native", publish), fallback


def _construct(name: str, publish: Callable[[Record], None] | None) -> Runtime:
    module_name, class_name = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)(publish)
