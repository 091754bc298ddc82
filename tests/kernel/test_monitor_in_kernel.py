"""The live monitor through a real kernel: updates while a cell runs, one sampler thread."""

from __future__ import annotations

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

TRAINING = """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data, labels = torch.randn(128, 256), torch.randint(0, 8, (128,))
"""

LOOP = """%%tpu_mode fused
import time
started = time.monotonic()
while time.monotonic() - started < 10:
    loss = torch.nn.functional.cross_entropy(model(data), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
"""


def widget_id(result) -> str:
    bundle = (result.results or result.displays)[-1]
    assert WIDGET_MIME in bundle, bundle.keys()
    return bundle[WIDGET_MIME]["model_id"]


def state_updates(result, model_id: str) -> list[dict]:
    return [
        m["content"]["data"]["state"]["state"]
        for m in result.messages
        if m["msg_type"] == "comm_msg"
        and m["content"]["comm_id"] == model_id
        and m["content"]["data"].get("method") == "update"
        and "state" in m["content"]["data"].get("state", {})
    ]


def test_monitor_updates_while_a_long_cell_runs(kernel):
    assert kernel.run(TRAINING).error is None
    shown = kernel.run("%tpu_monitor")
    assert shown.error is None, shown.error
    model_id = widget_id(shown)
    assert shown.results[-1]["text/plain"].startswith("tpunb monitor · native on cpu")
    running = kernel.run(LOOP, timeout=180)
    assert running.error is None, running.error
    updates = state_updates(running, model_id)
    assert len(updates) >= 15, len(updates)
    ticks = [u["tick"] for u in updates]
    assert ticks == sorted(ticks)
    assert any(u["mode"] == "fused" for u in updates)
    assert updates[-1]["groups_total"] > updates[0]["groups_total"]
    assert updates[-1]["memory"]["label"] == "host RSS"
    # the sampler prints nothing: the cell's only output is its summary (a line, and on a busy
    # machine the advice line when fused measured slower; torch may log to stderr: a CUDA build
    # of torch 2.8 on a CPU host says so when Inductor loads)
    lines = running.stdout.splitlines()
    assert lines[0].startswith("[tpunb] fused · "), running.stdout
    assert len(lines) <= 2, lines
    assert all(line.startswith("[tpunb] fused is slower here: ") for line in lines[1:]), lines
    assert "tpunb" not in running.stderr, running.stderr


def test_one_sampler_thread_however_often_the_monitor_is_shown(kernel):
    ids = {widget_id(kernel.run("tpunb.monitor()")) for _ in range(3)}
    assert len(ids) == 1  # one model, shown three times
    names = kernel.value("[t.name for t in __import__('threading').enumerate()]")
    assert names.count("tpunb-sampler") == 1, names


def test_monitor_sends_a_groups_graph_on_request(kernel):
    shown = kernel.run("%tpu_monitor")
    model_id = widget_id(shown)
    cell = "%%tpu_mode fused --sync-compile\ny = (torch.randn(256, 256) * 2 + 1).relu().sum().item()"
    ran = kernel.run(cell)  # (not a tiny group, which would never compile: config.TINY_OPS)
    assert ran.error is None, ran.error
    key = kernel.value("tpunb.stats()['groups'][-1]['key']")
    kernel.client.comm_msg = None  # jupyter_client has no comm helper; send the raw message
    msg = kernel.client.session.msg(
        "comm_msg",
        {"comm_id": model_id, "data": {"method": "custom", "content": {"type": "graph", "key": key}}},
    )
    kernel.client.shell_channel.send(msg)
    code = kernel.value("__import__('tpunb.monitoring', fromlist=['x'])._widget.graph.get('code', '')")
    assert "torch.ops.aten.relu" in code or "aten.relu" in code, code
