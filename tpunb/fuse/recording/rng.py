"""Random ops draw when their group runs, not when recorded; this keeps the streams eager's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tpunb.fuse.recording.trace import Trace


def default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else 0]
    return torch.default_generator


@contextlib.contextmanager
def rng_as_recorded(trace: Trace) -> Iterator[None]:
    """Random ops draw when the group runs, not when recorded: give them the generator state
    they were recorded under, and give the user back any state set since (a reseed, a
    ``fork_rng`` block), so streams match strict mode."""
    if trace.rng_state is None:
        yield
        return
    generator = default_generator(trace.device)
    now = generator.get_state()
    changed = not torch.equal(now, trace.rng_state)
    if changed:
        generator.set_state(trace.rng_state)
    try:
        yield
    finally:
        if changed:
            generator.set_state(now)
