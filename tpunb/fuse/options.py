"""What a fused scope was asked for (``%tpu_mode fused --sync-compile``, ``--no-hot-training``):
one frozen value, read by the engine and by each stage it hands a group to."""

from __future__ import annotations

from dataclasses import dataclass

from tpunb.fuse import config
from tpunb.modes import HOT_TRAINING_BY_DEFAULT


@dataclass(frozen=True)
class FuseOptions:
    sync_compile: bool = False  # compile on the first sighting, and wait (benchmarks, tests)
    compile: bool = True  # False: every group replays op by op (isolates recording from Inductor)
    # a module trained again and again is compiled whole, forward and backward (hotcalls.py),
    # and the optimizer stepping it too (hotsteps.py); False records every training call
    hot_training: bool = HOT_TRAINING_BY_DEFAULT
    # a hot call or step runs eagerly until its eager runs have cost this many seconds, then
    # compiles (plan.compile_pays_off); 0: compiled from its first hot run (tests of compiled code)
    compile_after_s: float = config.COMPILE_COST_S
    max_ops: int = config.MAX_OPS
