"""Runtimes: detection and construction. One module per backend beside this file."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace

from tpunb.events import Record
from tpunb.runtimes.base import CacheStats, MemoryInfo, ModeUnavailable, Runtime, RuntimeUnavailable
from tpunb.runtimes.detect import RuntimeChoice, detect_runtime

#: Runtime name -> "module:class". The TPU adapters join this table when they land; until
#: then a detected TPU runtime falls back to native and the load line says so.
ADAPTERS: dict[str, str] = {"native": "tpunb.runtimes.native:NativeRuntime"}

__all__ = [
    "ADAPTERS",
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


def resolve_choice(choice: RuntimeChoice) -> RuntimeChoice:
    """The choice this version of tpunb can honour: a missing adapter is an error only when
    the user asked for it by name; a detected one falls back to native, with the reason."""
    if choice.name in ADAPTERS:
        return choice
    if choice.explicit:
        raise RuntimeUnavailable(
            f"the {choice.name!r} runtime adapter is not available in this tpunb version; "
            f"available: {', '.join(ADAPTERS)}"
        )
    return replace(
        choice,
        name="native",
        reason=f"{choice.reason}, but tpunb's {choice.name} adapter is not available yet: native",
    )


def create_runtime(
    choice: RuntimeChoice | None = None, publish: Callable[[Record], None] | None = None
) -> tuple[Runtime, RuntimeChoice]:
    """Build the runtime for ``choice`` (detected when None); it publishes records to ``publish``."""
    resolved = resolve_choice(choice if choice is not None else detect_runtime())
    module_name, class_name = ADAPTERS[resolved.name].split(":")
    runtime_class = getattr(importlib.import_module(module_name), class_name)
    return runtime_class(publish), resolved
