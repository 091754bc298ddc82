"""Workarounds for process-wide state in torch that fused mode runs into, each with its reason.

Fused mode records on the notebook's thread and compiles on another; FX, Dynamo and the
dispatcher keep some state process-wide. Each function here names what breaks without it.
"""

from __future__ import annotations

from types import CodeType


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


def run_compiled_calls_beside_worker_traces() -> None:
    """On the calling (main) thread: a torch.compile'd function called while the worker's
    make_fx trace runs executes as plain eager PyTorch for that call, instead of failing.

    FX's "tracing now" flag is process-wide, and Dynamo refuses to run a compiled function
    under it ("Detected that you are using FX to symbolically trace a dynamo-optimized
    function"): with a fused group compiling in the background, a compiled model called in
    the next cell failed that way (reproduced: thousands of calls during a few compiles, a
    few percent failing). Dynamo's config is per thread, so this is set here, on the thread
    that runs the user's code; that call gets the same values, only not compiled."""
    from torch._dynamo import config

    if hasattr(config, "error_on_nested_fx_trace"):
        config.error_on_nested_fx_trace = False


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
