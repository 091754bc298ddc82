"""What to fix: at most three findings, ranked by the time they cost, each with its evidence.

Rules over what a profiled block did (its fusion groups, compiles, waits, counters and
memory), deterministic, one function per kind:

* ``recompile``: a group recorded at one line met new shapes again and again;
* ``host_sync``: the host waited for values at one line again and again (every step);
* ``capture``: fused mode's recording took longer than running what it recorded;
* ``compile_time``: first compiles cost more than everything the block's groups ran;
* ``cpu_fallback``: ops the device has no kernel for ran on the host (PyTorch/XLA);
* ``memory``: the peak came near the device's limit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tpunb.events import CompiledCell, CompileDone, FusionGroup, GroupStatus
from tpunb.runtimes import CPU_FALLBACK, MemoryInfo

#: How many findings a profile reports.
MOST = 3
#: A line must have waited this often to count as a sync in a loop.
REPEATED_WAITS = 3
#: A group must have met this many new shapes to be a recompile worth fixing (one new shape
#: is a changed input, once).
REPEATED_SHAPES = 2
#: Waits and captures under this share of the block's time are not worth a finding...
NEGLIGIBLE_SHARE = 0.02
#: ...nor under this many seconds.
NEGLIGIBLE_S = 0.001
#: First compiles are a finding only when they take this share of the block's time, or more.
COMPILE_SHARE = 0.25
#: A peak above this share of the limit is near it.
NEAR_LIMIT = 0.9

#: The profiler's names for the copies a CPU fallback makes (PyTorch/XLA).
FALLBACK_COPIES = frozenset({"aten::_to_cpu"})

KINDS = ("recompile", "host_sync", "capture", "cpu_fallback", "compile_time", "memory")


@dataclass(frozen=True)
class Finding:
    kind: str  # one of KINDS
    message: str  # what happened, in words
    seconds: float  # what it cost (0 for memory: it costs no time until it fails)
    evidence: str  # the numbers behind it
    fix: str
    at: str | None = None  # the user's line it is about

    def __post_init__(self) -> None:
        if self.kind not in KINDS:  # the kinds are the API's promise (Profile.findings)
            raise ValueError(f"unknown finding kind {self.kind!r}; the kinds: {', '.join(KINDS)}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Observed:
    """What a profiled block did, as the rules read it."""

    wall_s: float
    groups: Sequence[FusionGroup]
    compiles: Sequence[CompileDone]
    compiled_runs: Sequence[CompiledCell]
    waits: Sequence[dict]  # waits.wait_rows
    counters: dict[str, float]  # runtime counters that moved
    memory: MemoryInfo | None
    op_seconds: dict[str, float]  # host self time per op name, from the profiler
    compile_wait_s: float = 0.0  # waited at the block's end for compiles running in the background


def findings(seen: Observed) -> list[Finding]:
    """The findings worth a user's attention, costliest first, at most ``MOST``."""
    found = [
        *recompiles(seen),
        *host_syncs(seen),
        *capture(seen),
        *cpu_fallbacks(seen),
        *compile_time(seen),
        *memory(seen),
    ]
    return sorted(found, key=lambda finding: -finding.seconds)[:MOST]


def _worth(seconds: float, seen: Observed) -> bool:
    return seconds >= max(NEGLIGIBLE_S, NEGLIGIBLE_SHARE * seen.wall_s)


def _background_seconds(seen: Observed) -> dict[str, float]:
    """Compile time per group key of the compiles no group waited for (they report when they
    finish, on the worker)."""
    by_key: dict[str, float] = defaultdict(float)
    for done in seen.compiles:
        by_key[done.key] += done.compile_ms / 1000
    return by_key


def _compile_seconds(seen: Observed) -> dict[str, float]:
    """Compile time per group key: the background ones, and those in a group's own flush
    (``sync_compile``, PyTorch/XLA's graphs), which its record holds (inside its run time)."""
    by_key = _background_seconds(seen)  # (collect.py: no key a group waited for is among them)
    for group in seen.groups:
        if group.compile_ms:
            by_key[group.key] += group.compile_ms / 1000
    return by_key


def _shape_storms(seen: Observed) -> dict[tuple[str, int], list[FusionGroup]]:
    """New shapes of one step: misses of groups that start at the same line with as many ops
    (a training loop's first step, which also creates the optimizer's state, is another
    group), where there were at least ``REPEATED_SHAPES`` of them."""
    by_step: dict[tuple[str, int], list[FusionGroup]] = defaultdict(list)
    for group in seen.groups:
        # (an optimizer's hot step recompiles once per hyperparameter a schedule changes: not a shape)
        if group.miss_reason is not None and group.status != GroupStatus.HIT and not group.optimizer_step:
            by_step[(group.source, group.ops)].append(group)
    return {step: groups for step, groups in by_step.items() if len(groups) >= REPEATED_SHAPES}


def _last_shape_change(groups: list[FusionGroup]) -> str | None:
    """The last miss of a storm that a shape explains (a miss can also name a float or a
    flag that changed with it), else its last miss's reason."""
    return next(
        (g.miss_reason for g in reversed(groups) if "shape" in (g.miss_reason or "")), groups[-1].miss_reason
    )


def recompiles(seen: Observed) -> list[Finding]:
    background_s = _background_seconds(seen)
    found = []
    for (line, _), groups in _shape_storms(seen).items():
        # a compile a group waited for is in its run time already; a background one counts
        # once per key (a module compiled whole keeps one key for all its versions)
        seconds = sum(g.run_ms for g in groups) / 1000
        seconds += sum(background_s.get(key, 0.0) for key in {g.key for g in groups})
        if not _worth(seconds, seen):
            continue
        what = (
            f"{line}, a module's calls compiled whole, met {len(groups)} new shape(s): Dynamo compiles "
            "each, and runs the calls uncompiled past its limit of versions"
            if groups[0].whole_call
            else f"the group recorded at {line} met {len(groups)} new shape(s): each is a new graph "
            "to compile, run op by op until it is"
        )
        found.append(
            Finding(
                kind="recompile",
                message=what,
                seconds=seconds,
                evidence=f"what changed, last time: {_last_shape_change(groups)}; "
                f"{seconds * 1000:.0f} ms in those calls and their compiles",
                fix="pad or bucket the inputs to a few fixed shapes (pad batches to the longest, "
                "or to a multiple of 8 or 128), or drop the last ragged batch (drop_last=True)",
                at=line,
            )
        )
    for run in seen.compiled_runs:
        if run.recompile_reasons:
            found.append(
                Finding(
                    kind="recompile",
                    message=f"compile mode recompiled {len(run.recompile_reasons)}× ({run.key})",
                    seconds=run.wall_ms / 1000,
                    evidence="; ".join(run.recompile_reasons[:3]),
                    fix="pad or bucket the inputs to a few fixed shapes, or torch._dynamo.mark_dynamic "
                    "the dimension that varies",
                )
            )
    return found


def host_syncs(seen: Observed) -> list[Finding]:
    found = []
    for row in seen.waits:
        if row["count"] >= REPEATED_WAITS and _worth(row["seconds"], seen):
            found.append(
                Finding(
                    kind="host_sync",
                    message=f"the host waited for values {row['count']}× at {row['at']} ({row['what']})",
                    seconds=row["seconds"],
                    evidence=f"{row['seconds'] * 1000:.1f} ms waiting in all, "
                    f"{row['seconds'] * 1000 / row['count']:.2f} ms a time; in fused mode each wait also "
                    "ends the group, so the steps around it cannot fuse",
                    fix="read it every N steps instead: keep it on the device (total += loss.detach()) "
                    "and call .item() once at the end or every N steps",
                    at=row["at"],
                )
            )
    return found


def capture(seen: Observed) -> list[Finding]:
    """Recording ops (fused mode's cost per op, before anything runs) took longer than running
    the groups: compile mode traces the cell once instead of recording every op every time.
    Not where modules ran compiled whole: what was recorded then were their first calls, which
    do not come back (advice.py says why)."""
    if any(g.whole_call for g in seen.groups):
        return []
    groups = [g for g in seen.groups if g.ops]
    captured = sum(g.capture_ms for g in groups) / 1000
    ran = sum(g.run_ms for g in groups) / 1000
    if captured <= ran or not _worth(captured, seen):
        return []
    ops = sum(g.ops for g in groups)
    return [
        Finding(
            kind="capture",
            message=f"fused mode spent longer recording ops ({captured * 1000:.1f} ms) than running them "
            f"({ran * 1000:.1f} ms)",
            seconds=captured,
            evidence=f"{ops} ops in {len(groups)} groups, {captured * 1e6 / ops:.1f} us recording each; "
            "small ops cost less to run than to record",
            fix="%tpu_mode compile (torch.compile traces the cell once), or strict mode for ops this small; "
            "bigger batches make each op worth recording",
        )
    ]


def cpu_fallbacks(seen: Observed) -> list[Finding]:
    ops = {
        name.removeprefix(CPU_FALLBACK): int(count)
        for name, count in seen.counters.items()
        if name.startswith(CPU_FALLBACK)
    }
    if not ops:
        return []
    # the ops' own host time, and the device-to-host copies they make
    seconds = sum(s for name, s in seen.op_seconds.items() if name in ops or name in FALLBACK_COPIES)
    named = ", ".join(f"{op} ×{count}" for op, count in ops.items())
    return [
        Finding(
            kind="cpu_fallback",
            message=f"ops ran on the CPU, the device having no kernel for them: {named}",
            seconds=seconds,
            evidence="each is a device-to-host copy, the op on the host, and a copy back (the time is "
            "the ops' and the copies'); the runtime's fallback counters moved",
            fix="replace them with ops of static shape (nonzero → a mask and torch.where; "
            "boolean indexing → masked_fill or multiplication), or move that step off the device",
        )
    ]


def compile_time(seen: Observed) -> list[Finding]:
    """Compiles that cost more than what they compiled then ran for: first compiles, and
    recompiles that are not a storm of new shapes (``recompiles`` has those), such as a
    step's second compile once its varying floats are lifted. Background compiles count:
    their time is the worker's, and the block waited for them at its end."""
    compile_s = _compile_seconds(seen)
    stormed = {g.key for groups in _shape_storms(seen).values() for g in groups}
    firsts = [seconds for key, seconds in compile_s.items() if key not in stormed]
    first = sum(firsts)
    ran = sum(g.run_ms for g in seen.groups if g.status == GroupStatus.HIT) / 1000
    if first <= ran or first < COMPILE_SHARE * seen.wall_s:
        return []
    waited = (
        f"; the block waited {seen.compile_wait_s:.2f} s for them at its end" if seen.compile_wait_s else ""
    )
    return [
        Finding(
            kind="compile_time",
            message=f"compiling took {first:.2f} s, more than the compiled groups then ran for ({ran:.3f} s)",
            seconds=first - ran,
            evidence=f"{len(firsts)} compile(s) in this block{waited}; each later run of the same step "
            "hits the cache and costs only its run time",
            fix="for a cell that runs once, strict mode is faster; in a loop or a re-run cell this pays back "
            "(keep fused, and set a persistent cache with %tpu_cache DIR)",
        )
    ]


def memory(seen: Observed) -> list[Finding]:
    info = seen.memory
    if info is None or info.peak is None or not info.limit or info.peak < NEAR_LIMIT * info.limit:
        return []
    share = info.peak / info.limit
    return [
        Finding(
            kind="memory",
            message=f"{info.label} peaked at {share:.0%} of the limit",
            seconds=0.0,
            evidence=f"peak {info.peak / 2**30:.2f} GiB of {info.limit / 2**30:.2f} GiB",
            fix="a smaller batch with gradient accumulation, bfloat16 autocast, or activation checkpointing",
        )
    ]
