"""Fused mode's compile worker leaves the notebook's process-wide state alone.

torch's compilers save and restore process-wide state around their work (the random
generators' states) and set process-wide flags while they trace (FX's "tracing now"): on the
worker thread both reach the notebook's thread. Each test here fails without its workaround
(tpunb/fuse/workarounds.py).
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import tpunb
from tpunb.fuse.groups.worker import CompileWorker

NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_GPU)]


def _generator(device: str) -> torch.Generator:
    return torch.cuda.default_generators[0] if device == "cuda" else torch.default_generator


@pytest.mark.parametrize("device", DEVICES)
def test_draws_made_while_a_compile_preserves_rng_state_on_the_worker_are_kept(device):
    """The worker's compile saves the generators' states and restores them at its end; the
    notebook's draws made in between must not be undone."""
    from torch._dynamo.utils import preserve_rng_state

    inside, release = threading.Event(), threading.Event()

    def job() -> None:
        with preserve_rng_state():  # what AOTAutograd and Inductor wrap their work in
            inside.set()
            assert release.wait(30)

    torch.manual_seed(0)
    if device == "cuda":
        torch.cuda.manual_seed(0)
    future = CompileWorker().submit(job, wait=False)
    assert inside.wait(30)
    drawn = torch.rand(1000, device=device)  # the notebook draws meanwhile
    release.set()
    future.result()
    after = _generator(device).get_state()

    torch.manual_seed(0)
    if device == "cuda":
        torch.cuda.manual_seed(0)
    assert torch.equal(torch.rand(1000, device=device), drawn)
    assert torch.equal(_generator(device).get_state(), after), "the worker rewound the notebook's generator"


def _train(mode: str, steps: int | None, compiled_then: int = 40) -> tuple[list[torch.Tensor], list[float]]:
    """A loop that draws each step (batch indices, dropout); with ``steps`` None it runs until
    a group has compiled in the background, then ``compiled_then`` steps more."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data, labels = torch.randn(512, 32), torch.randint(0, 4, (512,))
    states: list[torch.Tensor] = []
    losses: list[float] = []
    compiles_before = tpunb.stats()["cache"]["compiles"]
    stop = steps
    with tpunb.mode(mode):
        while stop is None or len(losses) < stop:
            states.append(torch.random.get_rng_state())
            batch = torch.randint(0, 512, (16,))
            loss = F.cross_entropy(model(data[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if stop is None and tpunb.stats()["cache"]["compiles"] > compiles_before:
                stop = len(losses) + compiled_then
            assert len(losses) < 20_000, "no group compiled"
    return states, losses


def test_a_fused_loop_draws_strict_modes_stream_while_its_groups_compile():
    """The issue's case: batch indices and dropout masks drawn while the step's groups compile
    in the background. Strict's generator state before every draw equals fused's, cold and warm."""
    fused_states, fused_losses = _train("fused", None)
    strict_states, strict_losses = _train("strict", len(fused_losses))
    pairs = enumerate(zip(strict_states, fused_states, strict=True))
    differ = [step for step, (a, b) in pairs if not torch.equal(a, b)]
    assert not differ, f"fused drew another stream from step {differ[0]} of {len(fused_losses)}"
    assert fused_losses == pytest.approx(strict_losses, rel=1e-4, abs=1e-5)

    warm_states, warm_losses = _train("fused", len(fused_losses))  # the compiled groups from the start
    assert all(torch.equal(a, b) for a, b in zip(strict_states, warm_states, strict=True))
    assert warm_losses == pytest.approx(strict_losses, rel=1e-4, abs=1e-5)


class _WaitsInForward(torch.nn.Module):
    def __init__(self, inside: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.inside, self.release = inside, release

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        assert self.release.wait(30)
        return x + 1


def test_a_compiled_function_called_while_the_worker_traces_is_compiled_not_run_eagerly():
    """FX's tracing flag is process-wide: while the worker traces, Dynamo on the notebook's
    thread saw it and ran compiled functions uncompiled (a compile-mode cell: 0 graphs)."""
    from torch._dynamo.utils import counters

    inside, release = threading.Event(), threading.Event()
    tracing = _WaitsInForward(inside, release)
    future = CompileWorker().submit(lambda: torch.fx.symbolic_trace(tracing), wait=False)
    assert inside.wait(30)
    assert torch.fx._symbolic_trace.is_fx_tracing()  # the worker's flag, seen from here
    threading.Timer(0.3, release.set).start()  # the worker's job ends a moment later

    @torch.compile(backend="eager")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    frames = counters["frames"]["ok"]
    assert torch.equal(double(torch.ones(3)), torch.full((3,), 2.0))
    future.result()
    assert counters["frames"]["ok"] > frames, "the call ran uncompiled beside the worker's trace"


def test_a_compile_job_reads_no_autograd_cache_while_the_notebook_keeps_its_own():
    """A TorchTPU compile on the worker runs without AOTAutograd's cache (its lookup re-traces
    cached graphs with a tracer that patches every module call in the process); the notebook
    thread, meanwhile and after, keeps the cache as configured."""
    from torch._functorch import config

    from tpunb.fuse.groups.cache import GraphCache, Variant
    from tpunb.fuse.workarounds import autograd_cache_off_on_worker

    inside, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def job() -> tuple[None, str]:
        with autograd_cache_off_on_worker():
            seen.append(config.enable_autograd_cache)
            inside.set()
            assert release.wait(30)
        seen.append(config.enable_autograd_cache)
        return None, ""

    configured = config.enable_autograd_cache
    assert configured, "torch's default: AOTAutograd's cache on"
    cache = GraphCache(on_compiled=lambda name, variant: None)
    variant = Variant(lifted={})
    cache.compile("g", variant, job, wait=False)
    assert inside.wait(30)
    during = config.enable_autograd_cache  # read on the notebook thread while the job holds it off
    release.set()
    variant.future.result()
    with autograd_cache_off_on_worker():  # off the worker: as configured
        here = config.enable_autograd_cache
    assert seen == [False, configured] and during == here == configured == config.enable_autograd_cache
