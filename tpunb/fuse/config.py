"""The fused engine's thresholds and limits, in one place, each with its reason.

The engine's modules read them as ``config.NAME`` when they run, so a test (or a user
investigating) can change one for a block: ``monkeypatch.setattr(config, "TINY_OPS", 0)``.
Grouped by the stage that uses them (docs/engine.md walks the stages). Three limits bound
recompiles, each at its own level: ``STORM_VARIANTS`` (compiled shapes of one fused group),
Dynamo's ``recompile_limit`` (versions of one hot call's frame, torch's setting), and compile
mode's ``STORM_RECOMPILES`` (tpunb/recompiles.py, not the engine's).
"""

from __future__ import annotations

# --- recording (record.py, trace.py, settled.py, growing.py) --------------------------------

#: Different next ops kept after one step, and first ops of groups: bounds the cost of
#: checking a step's successors when shapes keep changing. A full branch drops its oldest
#: successor for a new one, so the sequence a loop settles into always finds a place.
MAX_BRANCHES = 8
MAX_FIRST = 64
#: Steps kept in all (about 1 KB each); past this the trie starts afresh.
MAX_STEPS = 200_000
#: Group keys kept per flush point (they differ in which results are still alive).
MAX_ENDS = 16
#: The largest plain input (elements) a trace copies: instead of flushing before a write to
#: it, and instead of keying a small view's strides.
KEEP_READ_MAX = 64
#: Elements an argument of a settled op may have: 2 x 16k logits (fp32: 128 KiB), and less.
SMALL_NUMEL = 1 << 15
#: Ops a group may have and still be too small to compile (with every tensor it touches small).
TINY_OPS = 16
#: Steady growths in a row before an op location runs outside groups.
GROWING_AFTER = 3

# --- groups: flushing, keys, compiling (options.py, cache.py, plan.py, worker.py) -----------

#: Default bound on ops per group: Inductor's compile time grows with the graph's size.
MAX_OPS = 1000
#: Compiled graphs one op sequence may have (one per input shape) before new shapes replay
#: until they prove hot: a recompile storm costs seconds per step, replay about what strict does.
STORM_VARIANTS = 8
#: Sightings of one shape after which it compiles even during a recompile storm.
STORM_SIGHTINGS = 3
#: The interpreter's thread switch interval while a background compile runs (default 5 ms).
COMPILE_SWITCH_INTERVAL_S = 0.0002

# --- hot calls and steps: compiled whole (plan.py, payoff.py, hotcalls.py, hotsteps.py) -----

#: Outermost calls of a module in fused scopes (no grad in eval mode, or grad in train mode)
#: after which it is compiled whole.
HOT_AFTER = 3
#: Eager steps over plain parameters in fused scopes after which an optimizer's step is compiled.
HOT_STEPS_AFTER = 2
#: What compiling a hot call or step costs the notebook, in seconds of eager work: Dynamo's
#: capture runs on the notebook thread (0.15-0.8 s per call or step of the workloads'
#: two-layer MLP, measured), and while the worker compiles, the notebook's steps run 10-50x
#: slower (the worker's Python holds the GIL; 30-600 ms steps against strict's 1.3 ms).
COMPILE_COST_S = 1.0
#: A hot call's or step's compiled runs timed before they are compared with its eager runs.
COMPARED_RUNS = 8
#: Its eager runs timed with the compile worker quiet that the comparison needs (payoff.py).
MIN_QUIET_RUNS = 4
#: Eager runs it may take after its compiled runs were timed, to time eager runs quietly; then
#: it is compared with what it has (a worker compiling for long leaves few quiet runs).
MAX_PROBES = 4 * COMPARED_RUNS
#: The least share of an eager run a compile is taken to save for a model defined again whose
#: earlier definition measured less (payoff.py): two compiled runs are a noisy measure, and a
#: long loop still gets its compile (after 50 times the usual eager time).
MIN_SAVING = 0.02
#: A training call's step per second of its forward: autograd runs its backward later, at
#: about twice the forward's cost (the usual 1:2 split of a step's work), unmeasured here.
TRAINING_STEP_PER_FORWARD = 3.0
#: How deep into argument objects (a cache, its list of layers, each layer) adopted tensors are
#: looked for.
OBJECT_DEPTH = 4

# --- the notebook around it (interrupts.py, idle_imports.py) --------------------------------------

#: How long after a finalizer dropped an interrupt it is sent again (the hook has returned).
RESEND_AFTER_S = 0.001
#: How long after the choosing cell the imports start (its output goes out first).
IDLE_DELAY_S = 0.1
