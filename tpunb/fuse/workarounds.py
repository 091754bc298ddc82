"""Workarounds for process-wide state in torch that fused mode runs into, each with its reason.

Fused mode records on the notebook's thread and compiles on another; FX, Dynamo and the
dispatcher keep some state process-wide. Each function here names what breaks without it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

_worker = threading.local()


@contextlib.contextmanager
def compile_worker_thread() -> Iterator[None]:
    """Mark the calling thread as tpunb's compile worker for the block (see ``on_compile_worker``)."""
    _worker.active = True
    try:
        yield
    finally:
        _worker.active = False


def on_compile_worker() -> bool:
    """Whether the calling thread is tpunb's compile worker, inside a compile job."""
    return getattr(_worker, "active", False)


#: Where torch's compilers restore a random generator's state: ``preserve_rng_state`` (AOTAutograd,
#: Inductor's codegen, Dynamo's frame conversion) looks these up by attribute at every use.
RNG_STATE_SETTERS = (
    ("torch.random", "set_rng_state"),
    ("torch.cuda", "set_rng_state"),
    ("torch.xpu", "set_rng_state"),
)


def keep_rng_states_beside_worker() -> None:
    """On the calling (main) thread, before the compile worker starts: a random generator's
    state set by torch's compilers on the worker thread is not set.

    AOTAutograd and Inductor save the process-wide generators' states before they trace and
    restore them after (``torch._dynamo.utils.preserve_rng_state``), so that a compile on the
    thread that runs the model leaves its random stream where it was. On the worker that
    restore rewinds the notebook's generator: every draw the notebook made during the compile
    (batch indices, dropout masks) is drawn again afterwards, and a training loop silently
    repeats its data order (measured: strict's state before draw #2102 seen again before
    draw #19322). The worker's tracing runs on fake tensors and draws nothing, so its restore
    has nothing to undo: on the worker it is skipped; every other thread gets torch's own.
    (AOTAutograd also swaps ``torch.cuda.set_rng_state`` for a no-op while it collects a
    graph's metadata, a few milliseconds per compile, process-wide: a CUDA state set by the
    notebook in that window, through ``torch.cuda.set_rng_state``, is lost. tpunb's own
    replays set generator states directly and are not affected.)"""
    import importlib

    for module_name, name in RNG_STATE_SETTERS:
        module = importlib.import_module(module_name)
        setter = getattr(module, name, None)
        if setter is not None and not getattr(setter, "skipped_on_compile_worker", False):
            setattr(module, name, _skipped_on_compile_worker(setter))


def _skipped_on_compile_worker(setter: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(setter)
    def set_state(*args: Any, **kwargs: Any) -> Any:
        if on_compile_worker():
            return None
        return setter(*args, **kwargs)

    set_state.skipped_on_compile_worker = True  # type: ignore[attr-defined]
    return set_state


def trace_inductor_helpers_here() -> None:
    """FX's symbolic tracer patches ``torch.nn.Module.__call__`` process-wide while it traces,
    so a module the main thread calls meanwhile is routed into that tracer and fails
    ("NameError: module is not installed as a submodule"). Inductor symbolically traces one
    helper, once per process, in its first lowering; tracing it here, on the calling (main)
    thread before the compile worker starts, keeps the worker from ever doing so while the
    user's modules run. (Inductor's other tracing, make_fx, forwards module calls untouched.)"""
    try:
        from torch._inductor.loop_body import InterpreterShim
    except ImportError:  # another torch layout: nothing known to warm
        return
    InterpreterShim._dummy_gm()


def compile_calls_beside_worker_traces() -> None:
    """On the calling (main) thread: a torch.compile'd function called while the worker
    traces a group is compiled and run as compiled (waiting for the worker's compile lock
    if it has to compile), not run as plain eager PyTorch.

    FX's "tracing now" flag is process-wide: while the worker's make_fx trace runs, Dynamo on
    every thread believes it is inside an FX trace. By default it then refuses a compiled
    function ("Detected that you are using FX to symbolically trace a dynamo-optimized
    function"); told not to refuse, it runs the function uncompiled, so a compile-mode cell
    started during a background compile ran entirely uncompiled (0 graphs, 0.48x strict).
    ``force_compile_during_fx_trace`` makes Dynamo ignore the flag: the compile it starts
    takes Dynamo's compile lock, which the worker holds for the whole of its job, so the two
    never trace at once. Dynamo's config is per thread (a context variable), so this holds
    on the thread that runs the user's code only. (A compiled function called inside an FX
    symbolic trace on that same thread is then compiled too, as Dynamo's option intends.)"""
    from torch._dynamo import config

    if hasattr(config, "force_compile_during_fx_trace"):
        config.force_compile_during_fx_trace = True


def autograd_cache_off_on_worker() -> contextlib.AbstractContextManager[Any]:
    """On the compile worker, AOTAutograd's cache is neither read nor written for the block.

    Its lookup unpickles each cached candidate's graph, and FX rebuilds a pickled GraphModule by
    tracing its code with a tracer that patches ``torch.nn.Module.__call__`` process-wide. A
    module the notebook thread called meanwhile was routed into that tracer and failed
    ("NameError: module is not installed as a submodule"): seen on a v5e, TorchTPU's compile of
    a GPT-2 turned hot in a fused cell, once the machine's cache held that graph from an earlier
    run, every time, its captured graph running beside the compile. Torch 2.13's config values
    are per context (each job runs in a copy of the notebook's), so the notebook thread keeps
    its own setting. Off the worker (``--sync-compile`` compiles on the notebook thread, which
    calls no module meanwhile) the cache is used as configured."""
    if not on_compile_worker():
        return contextlib.nullcontext()
    from torch._functorch import config

    return config_values(config, enable_autograd_cache=False)


def skip_dynamo_in(code: CodeType) -> bool:
    """Dynamo leaves frames of ``code``, and every frame they call, alone: the engine's
    dispatch entry point runs inside torch.compile'd code (a compiled function called in a
    fused cell) without Dynamo tracing the engine.

    Torch does this for every dispatch mode by wrapping ``__torch_dispatch__`` in
    ``torch._dynamo.disable`` (its ``_should_skip_dynamo``), which resets Dynamo's frame
    callback twice per op: about a microsecond, a fifth of an eager op, on every recorded
    op. Marking the code object once gives the same behaviour for nothing per op. Returns
    False where this torch has no such switch: the caller keeps torch's wrapper then.
    """
    try:  # the C module's names: importing torch._dynamo here would cost a second
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except (ImportError, AttributeError, TypeError):  # older or newer torch: keep torch's wrapper
        return False
    return True


#: A config name this torch lacks (``config_values``).
_ABSENT = object()


class config_values:
    """torch's ``config.patch(**values)`` for the block, on this thread's watch: for calls
    made every step. ``config.patch`` defines a class at each call, cyclic garbage that only
    the collector frees, and a scope per step (a cell per step, the model suite's harness)
    made the collector run within the steps (0.25 ms of a tiny BERT's 1.8 ms step, measured);
    a generator context cost several microseconds more per step than this class. Names the
    config lacks (another torch) are left out."""

    def __init__(self, config: Any, **values: Any) -> None:
        self.config, self.values = config, values
        self.before: dict[str, Any] = {}

    def __enter__(self) -> None:
        config = self.config
        before = {name: getattr(config, name, _ABSENT) for name in self.values}
        self.before = {name: value for name, value in before.items() if value is not _ABSENT}
        for name in self.before:
            setattr(config, name, self.values[name])

    def __exit__(self, *exc_info: object) -> None:
        for name, value in self.before.items():
            setattr(self.config, name, value)


#: Logger methods that print a message once per process (transformers adds them to
#: ``logging.Logger``): a call of one inside a traced call is a graph break for Dynamo.
ONCE_LOGGING = ("warning_once", "info_once")


def once_logging_out_of_graphs() -> contextlib.AbstractContextManager[Any]:
    """For a fused scope: Dynamo skips the once-a-process logger methods (``ONCE_LOGGING``)
    where it captures a hot call or step, instead of breaking the graph at them.

    Every Hugging Face model given labels asks ``self.loss_function``, which calls
    ``logger.warning_once`` when its config names no loss type (any model built from a config):
    Dynamo breaks the graph there, so a GPT-2 under the Trainer captured as two graphs in 3.2 s
    on the notebook's thread, against one graph in 1.6 s with the call skipped (measured here,
    a fresh process each). Nothing is lost: a call turns hot after runs that ran its Python
    eagerly or recorded, so each message on its path has printed already, and a ``_once``
    method prints it only once. Compile mode keeps Dynamo's default: its first call is traced,
    and the message would never print. Methods ``logging.Logger`` lacks (no transformers
    imported yet) are left out."""
    import logging

    from torch._dynamo import config

    once = {getattr(logging.Logger, name) for name in ONCE_LOGGING if hasattr(logging.Logger, name)}
    ignored = getattr(config, "ignore_logging_functions", None)
    if not once or ignored is None or once <= ignored:
        return contextlib.nullcontext()
    return config_values(config, ignore_logging_functions=ignored | once)
