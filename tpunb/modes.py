"""Execution modes and their options.

A mode says *how* the ops of a cell run; a runtime says *where*. Keeping the two apart is
what lets one notebook move between a laptop, a GPU box and a TPU without edits.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

Named = TypeVar("Named", bound=enum.Enum)


class Mode(enum.Enum):
    """The four execution modes, named as users type them."""

    DEBUG = "debug"
    STRICT = "strict"
    FUSED = "fused"
    COMPILE = "compile"

    def __str__(self) -> str:
        return self.value


MODE_DESCRIPTIONS: dict[Mode, str] = {
    Mode.DEBUG: "synchronous, one op at a time; NaN/Inf and bounds checks; errors name your line",
    Mode.STRICT: "plain PyTorch eager: asynchronous op-by-op",
    Mode.FUSED: "defer and fuse: ops are recorded, then compiled and run as one group",
    Mode.COMPILE: "torch.compile of the cell's work",
}

#: The mode a fresh kernel starts in: plain eager, so loading tpunb changes nothing by itself.
DEFAULT_MODE = Mode.STRICT


class ModeError(ValueError):
    """A mode name or option that tpunb does not accept."""


def member_named(kind: type[Named], value: object) -> Named | None:
    """The member of ``kind`` that ``value`` is or names (any case, surrounding spaces), or None."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        for member in kind:
            if member.value == key:
                return member
    return None


def parse_mode(value: str | Mode) -> Mode:
    """Turn user input (any case, surrounding spaces) into a Mode, or explain what is accepted."""
    if not isinstance(value, (str, Mode)):
        raise ModeError(f"mode must be a string, not {type(value).__name__}")
    found = member_named(Mode, value)
    if found is not None:
        return found
    valid = ", ".join(m.value for m in Mode)
    raise ModeError(f"unknown mode {value!r}; valid modes: {valid}")


#: Fused mode compiles a module trained again and again whole by default where Dynamo compiles
#: under tpunb's dispatch mode: torch 2.13 does (measured); torch 2.8 (Kaggle's image) skips
#: every frame under it, so there each module would warn and fall back to recording, and the
#: versions between are unmeasured. Elsewhere ``--hot-training`` still turns it on.
HOT_TRAINING_BY_DEFAULT = torch.torch_version.TorchVersion(torch.__version__) >= (2, 13)


@dataclass(frozen=True)
class ModeConfig:
    """A mode plus the options that tune it (options only some modes read).

    Frozen so a config can be stacked and compared without defensive copies.
    """

    mode: Mode = DEFAULT_MODE
    allow_nan: bool = False  # debug: a new NaN is not an error
    allow_inf: bool = False  # debug: a new Inf is not an error
    sync_compile: bool = False  # fused: compile a new group before running it, not in the background
    hot_training: bool = HOT_TRAINING_BY_DEFAULT  # fused: a module trained again and again compiled whole

    @classmethod
    def build(cls, mode: str | Mode, **options: bool) -> ModeConfig:
        """Parse ``mode`` and validate ``options`` against the fields this class knows."""
        parsed = parse_mode(mode)
        known = {name for name in cls.__dataclass_fields__ if name != "mode"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ModeError(
                f"unknown mode option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}"
            )
        return replace(cls(mode=parsed), **options)

    def describe(self) -> str:
        """Short text for status lines, naming the options that differ from their defaults:
        ``debug (allow nan)``, ``fused (no hot training)``."""
        default = ModeConfig(mode=self.mode)
        flags = [
            ("" if value else "no ") + name.replace("_", " ")
            for name in ("allow_nan", "allow_inf", "sync_compile", "hot_training")
            if (value := getattr(self, name)) != getattr(default, name)
        ]
        return f"{self.mode.value} ({', '.join(flags)})" if flags else self.mode.value
