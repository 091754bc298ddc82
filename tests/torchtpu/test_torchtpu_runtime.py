"""tpunb's TorchTPU adapter against the real torch_tpu package, on a host without a TPU."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tpunb_kernels import Kernel, start_kernel

MODE_OF = "tpunb.session.get_session().runtime.eager_mode"


@pytest.fixture(scope="module")
def tpu_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    kernel = start_kernel(tmp_path_factory.mktemp("torchtpu-kernel"), env={"TPUNB_RUNTIME": "torchtpu"})
    loaded = kernel.run("%load_ext tpunb\nimport torch, tpunb, tpunb.session", timeout=300)
    assert loaded.error is None, loaded.error
    assert "torchtpu runtime on cpu (no TPU present)" in loaded.stdout, loaded.stdout
    yield kernel
    kernel.shutdown()


def test_each_cell_runs_in_torchtpus_own_eager_mode(tpu_kernel: Kernel) -> None:
    expected = {
        "fused": "DEFER_AND_FUSE",
        "strict": "DEFER_NEVER",
        "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    }
    for mode, eager in expected.items():
        result = tpu_kernel.run(f"%%tpu_mode {mode}\nseen = {MODE_OF}")
        assert result.error is None, result.error
        assert tpu_kernel.value("seen") == eager
    # after each cell the scope is gone: TorchTPU's own default (strict) is back
    assert tpu_kernel.value(MODE_OF) == "DEFER_NEVER"


def test_default_mode_sets_the_global_eager_mode(tpu_kernel: Kernel) -> None:
    assert tpu_kernel.run("%tpu_mode fused").error is None
    # between cells no scope is open, so this reads TorchTPU's global (process-wide) mode
    assert tpu_kernel.value("torch.tpu.eager_mode.name") == "DEFER_AND_FUSE"
    thread = (
        "import threading\nfrom_thread = []\n"
        "t = threading.Thread(target=lambda: from_thread.append(torch.tpu.eager_mode.name))\n"
        "t.start(); t.join()"
    )
    assert tpu_kernel.run(thread).error is None
    assert tpu_kernel.value("from_thread") == ["DEFER_AND_FUSE"]  # threads follow the default
    assert tpu_kernel.run("%tpu_mode strict").error is None
    assert tpu_kernel.value("torch.tpu.eager_mode.name") == "DEFER_NEVER"


def test_a_failing_cell_restores_the_eager_mode(tpu_kernel: Kernel) -> None:
    result = tpu_kernel.run("%%tpu_mode fused\nraise ValueError('boom')")
    assert result.error is not None and result.error["ename"] == "ValueError"
    assert tpu_kernel.value(MODE_OF) == "DEFER_NEVER"
    assert tpu_kernel.value("tpunb.current_mode()") == "strict"


def test_cache_counters_are_torchtpus_own(tpu_kernel: Kernel) -> None:
    stats = tpu_kernel.value("tpunb.stats()['cache']")
    real = tpu_kernel.value(
        "[torch.tpu._get_cache_stats().num_cache_reqs, torch.tpu._get_cache_stats().num_cache_hits]"
    )
    assert [stats["requests"], stats["hits"]] == real
    assert set(tpu_kernel.value("sorted(tpunb.stats()['counters'])")) >= {
        "compile cache requests",
        "compile cache hits",
        "graphs compiled",
    }


def test_debug_mode_still_checks_cpu_tensors(tpu_kernel: Kernel) -> None:
    result = tpu_kernel.run("%%tpu_mode debug\nv = torch.tensor([-1.0])\nw = torch.log(v)")
    assert result.error is not None and "aten.log produced NaN" in result.error["evalue"]
    assert "line 3: w = torch.log(v)" in result.error["evalue"]


def test_memory_is_unknown_without_a_tpu(tpu_kernel: Kernel) -> None:
    assert tpu_kernel.value("tpunb.stats()['memory']") is None


def test_trace_artifacts_become_fusion_groups(tmp_path: Path) -> None:
    """With TORCH_TRACE set before import, TorchTPU records one event per materialization
    batch and its daemon emits them through ``_emit_event_artifacts``; tpunb's handler turns
    them into fusion groups. A host without a chip never runs a batch, so this calls
    TorchTPU's own emitter with the fields its C++ buffer produces."""
    env = {"TPUNB_RUNTIME": "torchtpu", "TORCH_TRACE": str(tmp_path / "trace")}
    kernel = start_kernel(tmp_path, env=env)
    try:
        assert kernel.run("%load_ext tpunb\nimport tpunb", timeout=300).error is None
        emit = (
            "from torch_tpu._internal import tracing\n"
            "tracing._emit_event_artifacts({'name': 'torchtpu_eager/kMm+kAdd+kAdd', 'cache_hit': False,\n"
            "    'reason': 'item()', 'aten_graph': 'graph():\\n  mm ...', 'stablehlo': ''})"
        )
        result = kernel.run(emit)
        assert result.error is None, result.error
        group = kernel.value("tpunb.stats()['groups'][-1]")
        assert group["top_ops"] == {"kMm": 1, "kAdd": 2} and group["ops"] == 3
        assert group["status"] == "miss" and group["trigger"] == "item()"
        graph = kernel.value(f"tpunb.session.get_session().runtime.group_graph({group['key']!r})")
        assert graph.startswith("graph():")
    finally:
        kernel.shutdown()


def test_detection_without_a_tpu_reports_it_and_uses_native(tmp_path: Path) -> None:
    kernel = start_kernel(tmp_path)
    try:
        loaded = kernel.run("%load_ext tpunb", timeout=300)
        assert "native runtime on cpu (torch_tpu is installed but no TPU present: CPU)" in loaded.stdout
    finally:
        kernel.shutdown()


def test_doctor_sees_torch_tpu_and_no_chip() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpunb", "doctor"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch_tpu" in done.stdout and "0.2.0" in done.stdout
    assert "torch_tpu is installed but no TPU present" in done.stdout


def test_without_a_chip_no_tier3_cache_is_named(tpu_kernel: Kernel) -> None:
    """On a chip tpunb names TorchTPU's tier-3 cache (the hardware suite checks it); here, with
    one named, TorchTPU's compiler would start libtpu and wait for TPU workers that do not exist."""
    shown = tpu_kernel.run("%tpu_cache")
    assert "compile cache at the default (set on first use)" in shown.stdout, shown.stdout


def test_cache_dir_sets_the_tier3_root_before_first_use(tpu_kernel: Kernel, tmp_path: Path) -> None:
    result = tpu_kernel.run(f"%tpu_cache {tmp_path / 'tier3'}")
    assert result.error is None, result.error
    assert tpu_kernel.value(
        "os.environ['TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT']".replace("os.", "__import__('os').")
    ) == str(tmp_path / "tier3")


def test_a_profiled_cell_reports_on_torchtpu(tpu_kernel: Kernel, tmp_path: Path) -> None:
    body = "w = torch.randn(64, 64)\nfor _ in range(3):\n    w = w @ w / 8"
    cell = f"%%tpu_profile --mode fused --trace {tmp_path}\n{body}"
    result = tpu_kernel.run(cell)
    assert result.error is None, result.error
    text = result.displays[-1]["text/plain"]
    assert text.startswith("tpunb profile · fused · torchtpu (cpu (no TPU present))"), text
    report = tpu_kernel.value(
        "{k: getattr(tpunb.last_profile(), k) for k in ('top_ops', 'trace_path', 'device_trace')}"
    )
    assert any(op["name"] == "aten::mm" and op["calls"] == 3 for op in report["top_ops"]), report["top_ops"]
    assert Path(report["trace_path"]).parent == tmp_path and report["device_trace"] is None


def test_a_compile_cell_keeps_the_optimizer_out_of_torchtpus_compiler(tpu_kernel: Kernel) -> None:
    """TorchTPU's compiled steps failed or trained wrongly on a chip: a compile cell runs
    torch.optim outside Dynamo, with backward() a graph break, and says so; TorchTPU's own
    Dynamo setting (trace_autograd_ops, which its import turns on) is back afterwards."""
    code = (
        "%%tpu_mode compile\nm = torch.nn.Linear(4, 2)\nopt = torch.optim.AdamW(m.parameters())\n"
        "for _ in range(2):\n    loss = m(torch.ones(3, 4)).sum()\n    loss.backward()\n"
        "    opt.step()\n    opt.zero_grad()"
    )
    result = tpu_kernel.run(code)
    assert result.error is None, result.error
    assert "ran uncompiled: 2 steps of AdamW" in result.stdout, result.stdout
    assert tpu_kernel.value("torch._dynamo.config.trace_autograd_ops") is True


def test_a_library_calling_torchtpus_reserved_api_is_named(tpu_kernel: Kernel, tmp_path: Path) -> None:
    """torch_tpu refuses ``torch.tpu.is_available()`` to callers outside torch (transformers 5.17's
    TrainingArguments died on it); the cell is told which package called it."""
    package = tmp_path / "asks_tpu"
    package.mkdir()
    (package / "__init__.py").write_text("import torch\n\ndef ready():\n    return torch.tpu.is_available()")
    cell = f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport asks_tpu\nasks_tpu.ready()"
    result = tpu_kernel.run(cell)
    assert result.error is not None and "is internal to TorchTPU" in result.error["evalue"], result.error
    assert "asks_tpu ? called torch.tpu.is_available, which torch_tpu keeps to torch itself" in result.stdout
