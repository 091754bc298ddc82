"""Parsing torch_xla's graph log: blocks in the format torch_xla 2.9 writes (captured from a
real run on its CPU device), read incrementally the way the xla runtime tails the file."""

from __future__ import annotations

from pathlib import Path

from tpunb.runtimes.xla import prepare_graph_log
from tpunb.runtimes.xla_graphs import GraphLog
from tpunb.versions import torch_xla_mismatch


def block(kind: str, cause: str, graph_hash: str, frames: list[str]) -> str:
    lines = [
        "=" * 80,
        f"{kind} Cause",
        f"  {cause}",
        "Graph Info: ",
        f"  Graph Hash: {graph_hash}",
        "  Number of Graph Inputs: 2",
        "  Number of Graph Outputs: 1",
        "Python Frame Triggered Execution: ",
        *[f"  {frame}" for frame in frames],
        "-" * 80,
        "=" * 80,
    ]
    prefix = f"{kind} Analysis: "
    return "\n" + "\n".join(prefix + line for line in lines) + "\n"


POST = "\n".join(
    f"Post Compilation Analysis: {line}"
    for line in ("=" * 80, "Graph input size: 0.000000 GB", "-" * 80, "=" * 80)
)
FRAMES = ["sync (/site-packages/torch_xla/torch_xla.py:87)", "<module> (/tmp/ipykernel_1/123.py:4)"]


def test_a_compiled_then_executed_graph_is_a_miss_and_a_rerun_a_hit(tmp_path: Path) -> None:
    log = tmp_path / "graphs.log"
    first = block("Compilation", "user torch_xla.sync", "ab" * 16, FRAMES)
    first += (
        "\nComputation hash: 1234\n\n" + POST + block("Execution", "user torch_xla.sync", "ab" * 16, FRAMES)
    )
    log.write_text(first)
    reader = GraphLog(str(log))
    runs = reader.read()
    assert len(runs) == 1
    run = runs[0]
    assert run.compiled and run.cause == "torch_xla.sync()" and run.graph_hash == "ab" * 16
    assert run.frames[-1] == ("<module>", "/tmp/ipykernel_1/123.py", 4)
    with log.open("a") as f:
        cause = "most likely user code trying to access tensor value before torch_xla.sync"
        f.write(block("Execution", cause, "ab" * 16, FRAMES))
    again = reader.read()
    assert [(r.compiled, r.cause) for r in again] == [(False, "value read")]
    assert reader.read() == []


def test_a_half_written_block_waits_for_the_next_read(tmp_path: Path) -> None:
    log = tmp_path / "graphs.log"
    text = block("Execution", "user torch_xla.sync", "cd" * 16, FRAMES)
    cut = len(text) // 2
    log.write_text(text[:cut])
    reader = GraphLog(str(log))
    assert reader.read() == []
    with log.open("a") as f:
        f.write(text[cut:])
    assert [r.graph_hash for r in reader.read()] == ["cd" * 16]


def test_skip_to_end_ignores_earlier_runs(tmp_path: Path) -> None:
    log = tmp_path / "graphs.log"
    log.write_text(block("Execution", "user torch_xla.sync", "ef" * 16, FRAMES))
    reader = GraphLog(str(log))
    reader.skip_to_end()
    assert reader.read() == []
    assert GraphLog(str(tmp_path / "missing.log")).read() == []


def test_graph_log_is_turned_on_only_when_nobody_else_configured_it(monkeypatch) -> None:
    monkeypatch.delitem(__import__("sys").modules, "torch_xla", raising=False)
    env: dict[str, str] = {}
    path = prepare_graph_log(env)
    assert path and env == {"PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG_FILE": path}
    assert prepare_graph_log({"PT_XLA_DEBUG_LEVEL": "1"}) is None  # the user's level, no graph blocks
    assert prepare_graph_log({"PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG_FILE": "/x.log"}) == "/x.log"
    assert prepare_graph_log({"TPUNB_XLA_GRAPH_LOG": "0"}) is None


def test_torch_and_torch_xla_versions_must_match() -> None:
    assert torch_xla_mismatch("2.9.0+cu128", "2.9.0") is None
    message = torch_xla_mismatch("2.13.0+cpu", "2.9.0")
    assert message == (
        "torch 2.13.0+cpu and torch_xla 2.9.0 must be the same release: "
        "pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'"
    )
    assert torch_xla_mismatch(None, "2.9.0") is None
