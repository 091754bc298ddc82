"""The compilers' warnings held back while tpunb compiles; everyone else's shown."""

from __future__ import annotations

import logging
import os
import threading
import warnings

import pytest

from tpunb import compiler_noise

DYNAMO_FILE = os.path.join(os.sep, "site-packages", "torch", "_dynamo", "variables", "functions.py")
USER_FILE = os.path.join(os.sep, "home", "user", "train.py")


def _warn_from(filename: str, text: str) -> None:
    warnings.warn_explicit(text, UserWarning, filename, 7)


@pytest.fixture
def shown():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def test_inside_a_quiet_block_the_compilers_warnings_are_held_back_and_kept(shown):
    with compiler_noise.quiet():
        _warn_from(DYNAMO_FILE, "Dynamo does not know how to trace the builtin `sys._getframe`")
        _warn_from(USER_FILE, "your own warning")
    assert [str(w.message) for w in shown] == ["your own warning"]
    assert (
        "UserWarning: Dynamo does not know how to trace the builtin `sys._getframe`"
        in compiler_noise.hidden()
    )


def test_outside_a_quiet_block_the_compilers_warnings_show(shown):
    with compiler_noise.quiet():
        pass
    _warn_from(DYNAMO_FILE, "Dynamo warns in a strict cell")
    assert [str(w.message) for w in shown] == ["Dynamo warns in a strict cell"]


def test_everything_raised_on_tpunbs_threads_is_held_back(shown):
    with compiler_noise.quiet():
        pass  # installs the hook; the thread below is not inside the block
    worker = threading.Thread(
        target=_warn_from, args=(USER_FILE, "from a background compile"), name="tpunb-compile_0"
    )
    worker.start()
    worker.join()
    other = threading.Thread(target=_warn_from, args=(USER_FILE, "from the user's thread"), name="loader")
    other.start()
    other.join()
    assert [str(w.message) for w in shown] == ["from the user's thread"]


def test_the_compilers_warning_logs_are_held_back_but_not_their_errors():
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    try:
        with compiler_noise.quiet():
            logging.getLogger("torch._dynamo.convert_frame").warning(
                "torch._dynamo hit config.recompile_limit (4)"
            )
            logging.getLogger("torch._dynamo.convert_frame").error("a real failure")
        logging.getLogger("torch._dynamo.convert_frame").warning("outside the block")
    finally:
        logger.removeHandler(handler)
    assert records == ["a real failure", "outside the block"]
    assert (
        "torch._dynamo.convert_frame: torch._dynamo hit config.recompile_limit (4)" in compiler_noise.hidden()
    )


def test_a_warning_raised_while_dynamo_compiles_is_held_back_and_one_the_compiled_code_raises_shows(shown):
    """A backend that warns runs inside Dynamo's compile (held back); the user's own
    ``warnings.warn`` in the compiled function runs with the compiled code (shown)."""
    import torch

    def backend(graph, example_inputs):
        warnings.warn("a compiler's remark", DeprecationWarning, stacklevel=1)
        return graph.forward

    def step(x):
        warnings.warn("the user's own", stacklevel=1)
        return x * 2

    with compiler_noise.quiet():
        torch.compile(step, backend=backend)(torch.ones(3))
    assert [str(w.message) for w in shown] == ["the user's own"]
    assert "DeprecationWarning: a compiler's remark" in compiler_noise.hidden()


def test_dynamos_cleanup_of_a_helper_a_cleared_namespace_lost_is_dropped(monkeypatch):
    """Dynamo deletes its helper globals when compiled code dies; ``%run`` may have cleared the
    namespace already. That KeyError is held back; other unraisable errors still reach the hook."""
    import gc
    import sys

    from torch._dynamo.utils import CleanupHook, CleanupManager

    reached: list = []
    monkeypatch.setattr(sys, "unraisablehook", reached.append)
    with compiler_noise.quiet():
        pass  # installs the hook over the one above

    class Compiled:
        pass

    class Broken:
        def __del__(self):
            raise ValueError("a real error at collection")

    scope: dict = {}
    compiled = Compiled()  # Dynamo keys the hooks by the code it compiled, as here
    CleanupManager.instance[compiled] = [CleanupHook.create(scope, "__builtins_dict___9", {})]
    scope.clear()  # as %run clears a script's namespace before running it again
    del compiled
    gc.collect()
    broken = Broken()
    del broken
    assert [type(u.exc_value) for u in reached] == [ValueError]
    assert "torch._dynamo cleanup: KeyError '__builtins_dict___9'" in compiler_noise.hidden()


def test_a_runtimes_own_warning_is_held_back_and_the_users_shows(shown, monkeypatch):
    """TorchTPU reads ``.grad`` inside every copy to the host; the same warning from a line
    of the user's that reads ``.grad`` still shows."""
    import torch

    from tpunb.runtimes.torchtpu import grad_read_is_torchtpus

    monkeypatch.setattr(compiler_noise, "_runtime_noise", [])
    compiler_noise.hold_runtime_warnings(grad_read_is_torchtpus)
    loss = (torch.ones(2, requires_grad=True) * 2).sum()
    read = getattr  # as TorchTPU's copy to the host reads it: this line never names the attribute
    read(loss, "gr" + "ad")
    assert loss.grad is None  # the user's own read
    assert len(shown) == 1 and "not a leaf Tensor" in str(shown[0].message)
    assert any("not a leaf Tensor" in held for held in compiler_noise.hidden())


def test_the_unraisable_hook_works_while_its_module_is_torn_down(monkeypatch, capsys):
    """At interpreter exit, when Dynamo's cleanups run, a module's globals can be gone (the
    hook raised ``'NoneType' object has no attribute 'path'`` four times on a TPU machine): it
    keeps what it needs on itself."""
    import gc
    import sys

    from torch._dynamo.utils import CleanupHook, CleanupManager

    reached: list = []
    monkeypatch.setattr(sys, "unraisablehook", reached.append)
    with compiler_noise.quiet():
        pass  # installs the hook over the one above
    for name in ("_DYNAMO_UTILS", "_hold", "os"):
        monkeypatch.setattr(compiler_noise, name, None)  # as at exit

    class Compiled:
        pass

    scope: dict = {}
    compiled = Compiled()
    CleanupManager.instance[compiled] = [CleanupHook.create(scope, "__builtins_dict___8", {})]
    scope.clear()
    del compiled
    gc.collect()
    assert reached == []
    assert "Exception ignored" not in capsys.readouterr().err  # the hook itself did not fail
