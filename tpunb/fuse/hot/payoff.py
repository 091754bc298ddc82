"""What a hot call or step has cost run eagerly and compiled: whether its compile has paid off
yet (rent or buy, plan.py's ``compile_pays_off``), and, once it runs compiled, whether the
compiled code is faster than the eager runs were (``compiled_is_slower``).

A hot module call or optimizer step (hotcalls.py, hotsteps.py) runs eagerly, as strict mode
does, until its eager runs have cost what a compile costs the notebook; then it compiles. What
counts toward the compile is what compiling would save: the whole eager run, unless an earlier
definition of the same model measured less (``saving``). A word-level LSTM run again with
``%run`` (a new class each run, so Dynamo captures it again) saved 4 % a call compiled, and each
run paid 0.15-0.22 s of capture for it; counting 4 % of each eager run, the call compiles only in
a loop long enough to repay that.

On a small model a compiled call can still be slower than the eager one it replaces: Dynamo's
guards and the compiled wrapper cost about 0.7 ms a call here, more than a two-layer MLP's
forward. So its first compiled runs that hit are timed, and if their median is slower than
that of its last eager runs, it runs eagerly for good: nothing runs slower than strict without need.

Only runs timed while the compile worker was quiet are compared (``CompileWorker.quiet_since``):
a run beside a compile is slowed by it, and an optimizer step whose eager runs were all timed
beside its model's compile (ignite's MLP: 4-20 ms against 0.2 ms alone) stayed compiled at 1.5x
its eager time. A call or step with too few quiet eager runs once its compiled runs are timed
runs eagerly a little longer to time them (``awaiting_eager``).
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from tpunb.fuse import config
from tpunb.fuse.groups.plan import compile_pays_off, compiled_is_slower


@dataclass
class Payoff:
    """One hot call's (in one regime) or step's eager and compiled run times."""

    spent_s: float = 0.0  # its eager runs' cost toward a compile (a training call's weighted)
    eager_runs: int = 0
    # its last eager runs' own times: the first runs of a process pay one-time costs
    recent_eager_s: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=config.COMPARED_RUNS)
    )
    compiled_s: list[float] = field(default_factory=list)  # its first compiled runs that hit
    slower: bool = False  # its compiled runs were slower than its eager runs: eager for good
    judged: bool = False  # its compiled and eager runs have been compared
    probes: int = 0  # eager runs after its compiled runs were timed, to time its eager runs
    #: the share of an eager run's time its compiled run saves, as measured on an earlier
    #: definition of the same code (hotcode.py's ``lineage``); 1.0 where none was measured
    saving: float = 1.0

    @property
    def eager_ms(self) -> float | None:
        """Its recent eager runs' median, in ms (what strict mode costs it), once it has run so."""
        return statistics.median(self.recent_eager_s) * 1000 if self.recent_eager_s else None

    def compiles_now(self, compiled_before: bool, sync_compile: bool, after_s: float) -> bool:
        """Whether this run goes through Dynamo: it has run compiled before, or its compile
        pays off now, unless compiled runs proved slower than eager ones."""
        if self.slower or self.awaiting_eager:
            return False
        return compiled_before or compile_pays_off(self.spent_s, sync_compile, after_s)

    @property
    def awaiting_eager(self) -> bool:
        """Whether its compiled runs are timed but too few of its eager runs were timed quietly
        to compare them with: it runs eagerly until they are (at most ``MAX_PROBES`` runs)."""
        return not self.judged and len(self.compiled_s) >= config.COMPARED_RUNS

    def ran_eagerly(self, seconds: float, weight: float = 1.0, quiet: bool = True) -> bool:
        """An eager run took ``seconds`` (counted ``weight`` times toward a compile; timed beside
        a compile unless ``quiet``, then not compared); returns whether it was the first."""
        self.eager_runs += 1
        if quiet:
            self.recent_eager_s.append(seconds)
        self.spent_s += seconds * weight * self.saving
        if self.awaiting_eager:
            self.probes += 1
            if len(self.recent_eager_s) >= config.MIN_QUIET_RUNS or self.probes >= config.MAX_PROBES:
                self._judge()
        return self.eager_runs == 1

    def measured_saving(self) -> float | None:
        """The share of an eager run's time a compiled run saved (the medians of its compiled
        runs that hit and of its last eager runs), bounded to [``MIN_SAVING``, 1]; None before
        two compiled runs (``--sync-compile`` runs none eagerly: nothing to compare). A model
        defined again (a script run again with ``%run``) starts from it."""
        if len(self.compiled_s) < 2 or not self.recent_eager_s:
            return None
        saved = 1.0 - statistics.median(self.compiled_s) / statistics.median(self.recent_eager_s)
        return min(1.0, max(config.MIN_SAVING, saved))

    def ran_compiled(self, seconds: float, quiet: bool = True) -> bool:
        """A compiled run that hit took ``seconds`` (beside a compile unless ``quiet``, then
        not compared); returns True once, when the first ``COMPARED_RUNS`` quiet ones prove
        slower than the eager runs (never where nothing ran eagerly: ``--sync-compile``, where
        compiled code is what is asked for)."""
        if not self.eager_runs or not quiet or len(self.compiled_s) >= config.COMPARED_RUNS:
            return False
        self.compiled_s.append(seconds)
        if len(self.compiled_s) < config.COMPARED_RUNS or len(self.recent_eager_s) < config.MIN_QUIET_RUNS:
            return False  # (too few quiet eager runs: ``awaiting_eager``)
        return self._judge()

    def _judge(self) -> bool:
        """Compare its compiled runs with its quiet eager runs, once; returns whether slower
        (not where no eager run was ever quiet: it stays compiled, as asked before)."""
        self.judged = True
        if self.recent_eager_s:
            self.slower = compiled_is_slower(
                statistics.median(self.compiled_s), statistics.median(self.recent_eager_s)
            )
        return self.slower

    def slower_reason(self) -> str:
        """Why it runs eagerly again, in words, for its group row."""
        compiled_ms, eager_ms = (
            statistics.median(self.compiled_s) * 1000,
            statistics.median(self.recent_eager_s) * 1000,
        )
        return (
            f"compiled, it ran slower than eagerly ({compiled_ms:.2f} ms a run against {eager_ms:.2f} ms): "
            "it runs as strict mode runs it from now on"
        )
