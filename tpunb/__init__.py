"""tpunb: run PyTorch interactively on TPUs (and GPUs and CPUs), cell by cell.

In a notebook::

    %load_ext tpunb
    %tpu_mode fused

In a script or a test, the same through the API: ``set_mode``, ``current_mode``, ``mode``
and ``stats``. Importing tpunb is cheap: torch and the runtime load on first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tpunb.runtimes import Runtime

__all__ = [
    "__version__",
    "adopt",
    "compile",
    "current_mode",
    "device",
    "grad_scaler",
    "jax_op",
    "last_profile",
    "load_ipython_extension",
    "mode",
    "monitor",
    "pallas_call",
    "precision",
    "profile",
    "runtime",
    "set_mode",
    "set_precision",
    "stats",
    "unload_ipython_extension",
]


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext tpunb``: detect the runtime, add the magics, print one status line."""
    from tpunb.ipython_hooks import load

    load(shell, __version__)


def unload_ipython_extension(shell: Any) -> None:
    from tpunb.ipython_hooks import unload

    unload(shell)


def set_mode(name: str, **options: bool) -> None:
    """Set the default mode (``debug``, ``strict``, ``fused``, ``compile``) from now on.

    Options: ``allow_nan``, ``allow_inf`` (debug mode).
    """
    from tpunb.modes import ModeConfig
    from tpunb.session import get_session

    get_session().set_default(ModeConfig.build(name, **options), source="api")


def current_mode() -> str:
    """The mode ops run in right now, e.g. ``"strict"``."""
    from tpunb.session import get_session

    return get_session().effective.mode.value


@contextmanager
def mode(name: str, **options: bool) -> Iterator[None]:
    """``with tpunb.mode("debug"): ...`` runs the block in a mode; nests; restores on error."""
    from tpunb.modes import ModeConfig
    from tpunb.session import get_session

    with get_session().scoped(ModeConfig.build(name, **options)):
        yield


def set_precision(name: str) -> None:
    """Set the precision (``fp32``, ``bf16``, ``fp16``) of this and later cells: autocast on this
    runtime's device. Refused, with the reason, where the runtime cannot run it."""
    from tpunb.mixed_precision import parse_precision
    from tpunb.session import get_session

    get_session().set_precision(parse_precision(name))


@contextmanager
def precision(name: str) -> Iterator[None]:
    """``with tpunb.precision("bf16"): ...`` runs the block in a precision; nests; restores on error."""
    from tpunb.mixed_precision import parse_precision
    from tpunb.session import get_session

    with get_session().precision_scoped(parse_precision(name)):
        yield


def grad_scaler() -> Any:
    """The loss scaler for the current precision: a ``torch.amp.GradScaler`` that scales for
    fp16 on a GPU, and passes through (``enabled=False``) everywhere else, so one training
    loop serves every precision: ``grad_scaler().scale(loss).backward()``,
    ``grad_scaler().step(optimizer)``, ``grad_scaler().update()``."""
    from tpunb.session import get_session

    return get_session().grad_scaler()


def stats() -> dict[str, Any]:
    """A plain-dict snapshot: runtime, device, mode, memory, cache counters, fusion groups."""
    from tpunb.session import get_session

    return get_session().stats()


def adopt(*objects: Any) -> int:
    """Let modules' parameters and optimizers' state take part in fused groups (in place).

    Fused notebook cells do this for the modules and optimizers in the notebook's namespace;
    scripts call it once before ``with tpunb.mode("fused")``. Returns how many tensors were
    adopted (0 on runtimes that fuse without it).
    """
    return runtime().adopt(*objects)


def compile(fn_or_module: Any, **torch_compile_options: Any) -> Any:
    """``torch.compile`` on this runtime's backend, reporting like compile-mode cells: new
    graphs, graph breaks and recompiles (with the failed guard in words) land in
    ``tpunb.stats()["compiled"]``; repeated recompiles warn once with the usual fixes."""
    from tpunb.cellcompile import compile_callable
    from tpunb.session import get_session

    session = get_session()
    return compile_callable(
        fn_or_module,
        session.runtime.compile_function,
        session.bus.publish,
        session.runtime.compiled_graphs,
        **torch_compile_options,
    )


def monitor() -> Any:
    """The live monitor widget (memory, fusion groups, compile cache), updating while cells run.

    Display it as a cell's last expression. Outside a kernel, returns a text snapshot.
    """
    from tpunb.monitoring import has_widget_frontend, monitor_widget, text_snapshot
    from tpunb.session import get_session

    session = get_session()
    return monitor_widget(session) if has_widget_frontend() else text_snapshot(session)


def profile(
    mode: str | None = None, trace: str | None = None, top: int | None = None, shapes: bool | None = None
) -> Any:
    """``with tpunb.profile() as p:`` runs the block under the runtime's profiler; when it ends,
    ``p`` holds the top ops, fusion groups, waits, findings (``p.findings``: what to fix, the
    costliest first), the trace's path and ``p.plot()``. ``mode`` runs the block in that mode;
    ``trace`` is the directory for the trace file; ``top`` how many ops to list (10); ``shapes``
    records the ops' input shapes (default: on, but on the native runtime, where recording
    them keeps fused mode from adopting tensors)."""
    from tpunb.profiling import profile as run

    return run(mode=mode, trace=trace, top=top, shapes=shapes)


def last_profile() -> Any:
    """The report of the last ``%%tpu_profile`` cell or ``tpunb.profile()`` block (None before one)."""
    from tpunb.profiling import last_profile as last

    return last()


def jax_op(fn: Any = None, **options: Any) -> Any:
    """``@tpunb.jax_op``: a function written with ``jax.numpy`` or a Pallas kernel, callable on
    torch tensors, with autograd through ``jax.vjp``. Options: ``out`` (shape/dtype hints,
    checked when JAX traces the op) and ``name``. Needs ``pip install 'tpunb[jax]'``."""
    from tpunb.jaxops import jax_op as make

    return make(fn, **options)


def pallas_call(kernel: Any, **options: Any) -> Any:
    """``jax.experimental.pallas.pallas_call`` that interprets the kernel where JAX has no
    Pallas compiler (the CPU), so a notebook with Pallas kernels also runs on a laptop."""
    from tpunb.jaxops import pallas_call as call

    return call(kernel, **options)


def device() -> Any:
    """The ``torch.device`` this kernel's tensors belong on: ``tpu:0`` (TorchTPU), ``xla:0``
    (PyTorch/XLA), ``cuda:0`` or ``cpu``. ``model.to(tpunb.device())`` makes a notebook run on
    whatever chip the kernel has, and on a laptop unchanged."""
    import torch

    return torch.device(runtime().device.split()[0])  # "cpu (no TPU present)": the CPU


def runtime() -> Runtime:
    """The runtime this process uses (detected on first use)."""
    from tpunb.session import get_session

    return get_session().runtime
