"""JAX ops in the monitor: in fused mode each call is a group of its own, with JAX's
compile time when it compiled (a miss) or none (a hit of JAX's jit cache)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tpunb.events import FusionGroup, GroupStatus
from tpunb.modes import Mode
from tpunb.source import locate


def report_call(
    *, name: str, key: str, tensors: Sequence[torch.Tensor], compiles: int, compile_s: float, run_s: float
) -> None:
    from tpunb.session import get_session

    session = get_session()
    if session.effective.mode is not Mode.FUSED:
        return
    where = locate()
    session.bus.publish(
        FusionGroup(
            key=key,
            ops=1,
            top_ops={f"jax:{name}": 1},
            input_shapes=[list(t.shape) for t in tensors],
            trigger=f"jax op at {where}" if where else "jax op",
            source=str(where) if where else "(no user frame found)",
            status=GroupStatus.MISS if compiles else GroupStatus.HIT,
            compile_ms=compile_s * 1000 if compiles else None,
            run_ms=max(run_s, 0.0) * 1000,
            lifted=0,
        )
    )
