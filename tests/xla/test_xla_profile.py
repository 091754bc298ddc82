"""``%%tpu_profile`` on real torch_xla (CPU PJRT device): torch.profiler's view of the lazy
tensors, torch_xla's counters over the cell, and an op that falls back to the CPU found."""

from __future__ import annotations

import json
from pathlib import Path

from tpunb_kernels import Kernel

FALLBACK = """v = (torch.arange(4096, device='xla') % 3).float()
for _ in range(40):
    found = torch.nonzero(v * 2).shape[0]"""


def test_an_op_without_a_device_kernel_is_the_top_finding(xla_kernel: Kernel, tmp_path: Path) -> None:
    cell = f"%%tpu_profile --mode fused --trace {tmp_path}\n{FALLBACK}"
    warm = xla_kernel.run(cell)  # its graphs compile here: in the second run only the fallback is left
    assert warm.error is None, warm.error
    result = xla_kernel.run(cell)
    assert result.error is None, result.error
    text = result.displays[-1]["text/plain"]
    assert text.startswith("tpunb profile · fused · xla (xla:0)"), text
    report = xla_kernel.value(
        "{k: getattr(tpunb.last_profile(), k) for k in ('findings', 'counters', 'trace_path', 'top_ops', "
        "'device_trace')}"
    )
    top = report["findings"][0]
    assert top["kind"] == "cpu_fallback" and "aten::nonzero ×40" in top["message"], report["findings"]
    assert report["counters"]["cpu fallback: aten::nonzero"] == 40
    assert report["counters"]["graphs executed"] >= 40  # each nonzero needs v * 2's values
    assert any(op["name"] == "aten::nonzero" for op in report["top_ops"]), report["top_ops"]
    assert "Runtime counters that moved" in text
    events = json.loads(Path(report["trace_path"]).read_text())["traceEvents"]
    assert any(e.get("name") == "aten::nonzero" for e in events)
    # torch_xla's own profiler ran too, in TensorBoard's layout
    device = Path(report["device_trace"])
    assert device.parent == tmp_path and list(device.glob("plugins/profile/*/*.xplane.pb"))
    assert f"Device trace: {device}" in text
