"""The lab extension's comm, spoken to by jupyter_client the way JupyterLab speaks it.

JupyterLab's side (extension/src/link.ts) registers the target, reads state messages,
sends ``set_mode``/``monitor``/``graph`` requests, and after a reload finds the open comm
with a comm-info request and opens its own. These tests send exactly those messages to a
real kernel.
"""

from __future__ import annotations

import queue
import time
import uuid
from typing import Any

import pytest
from tpunb_kernels import Kernel


def send_comm(kernel: Kernel, msg_type: str, content: dict[str, Any]) -> str:
    msg = kernel.client.session.msg(msg_type, content)
    kernel.client.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def request(kernel: Kernel, comm_id: str, data: dict[str, Any]) -> None:
    send_comm(kernel, "comm_msg", {"comm_id": comm_id, "data": data})


def comm_data(kernel: Kernel, until, timeout: float = 10, comm_id: str | None = None) -> list[dict]:
    """Comm message data from IOPub (opens included) until ``until(data)`` holds."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            break
        if msg["msg_type"] not in ("comm_open", "comm_msg"):
            continue
        content = msg["content"]
        if comm_id is not None and content["comm_id"] != comm_id:
            continue
        if msg["msg_type"] == "comm_open" and content.get("target_name") != "tpunb":
            continue
        seen.append({**content["data"], "_comm_id": content["comm_id"]})
        if until(seen[-1]):
            return seen
    raise AssertionError(f"condition not met in {timeout} s; comm data seen: {seen}")


def load_and_open(kernel: Kernel, hello: bool = True) -> tuple[str, dict]:
    """``%load_ext tpunb``: the kernel opens a comm to the page with the first state, and the
    page (``hello``) says it took it."""
    result = kernel.run("%load_ext tpunb\nimport torch, tpunb")
    assert result.error is None, result.error
    opens = [m for m in result.messages if m["msg_type"] == "comm_open"]
    tpunb_opens = [m["content"] for m in opens if m["content"]["target_name"] == "tpunb"]
    assert len(tpunb_opens) == 1, opens
    comm_id = tpunb_opens[0]["comm_id"]
    if hello:
        request(kernel, comm_id, {"type": "hello"})
        comm_data(kernel, lambda d: d.get("type") == "state" and d["_comm_id"] == comm_id)
    return comm_id, tpunb_opens[0]["data"]


def tpunb_threads(kernel: Kernel) -> list[str]:
    return kernel.value("[t.name for t in __import__('threading').enumerate() if 'tpunb' in t.name]")


def test_a_comm_no_page_answers_keeps_the_kernel_from_polling(fresh_kernel: Kernel) -> None:
    """nbclient and a bare jupyter_client never answer the comm %load_ext opens: no thread
    may wake for it. Once a page says hello, the one sampler feeds it."""
    comm_id, _ = load_and_open(fresh_kernel, hello=False)
    assert fresh_kernel.run("%tpu_mode debug\nx = torch.ones(3) + 1").error is None
    time.sleep(1)
    assert "tpunb-sampler" not in tpunb_threads(fresh_kernel)
    request(fresh_kernel, comm_id, {"type": "hello"})
    state = comm_data(fresh_kernel, lambda d: d.get("type") == "state")[-1]
    assert state["default"] == "debug"
    assert tpunb_threads(fresh_kernel).count("tpunb-sampler") == 1


def test_loading_opens_the_comm_with_the_kernels_state(fresh_kernel: Kernel) -> None:
    _, state = load_and_open(fresh_kernel)
    assert state["type"] == "state"
    assert (state["runtime"], state["mode"], state["default"]) == ("native", "strict", "strict")
    assert state["modes"] == ["debug", "strict", "fused", "compile"]
    assert state["busy"] is False and state["pending"] is None
    memory = state["memory"]
    assert memory["label"] == "host RSS" and 0 < memory["used"] < memory["limit"]
    # loading again re-announces on the same comm instead of opening another
    again = fresh_kernel.run("%load_ext tpunb")
    assert not [m for m in again.messages if m["msg_type"] == "comm_open"]


def test_the_picker_sets_the_default_of_the_next_cells(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    request(fresh_kernel, comm_id, {"type": "set_mode", "mode": "fused"})
    comm_data(fresh_kernel, lambda d: d.get("default") == "fused")
    assert fresh_kernel.value("tpunb.current_mode()") == "fused"
    # the cell really ran fused: its tensor work became a fusion group
    ran = fresh_kernel.run("x = torch.ones(64) * 2 + 1\nprint(float(x.sum()))")
    assert ran.stdout.startswith("192.0") and "fused" in ran.stdout, ran.stdout


def test_a_pick_during_a_running_cell_applies_when_it_ends(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    cell = "import time; time.sleep(2.5); print('cell mode', tpunb.current_mode())"
    msg_id = fresh_kernel.client.execute(cell)
    busy = comm_data(fresh_kernel, lambda d: d.get("busy") is True)
    assert busy[-1]["mode"] == "strict"
    request(fresh_kernel, comm_id, {"type": "set_mode", "mode": "debug"})
    result = fresh_kernel.collect(msg_id)
    assert "cell mode strict" in result.stdout  # the running cell kept its mode
    comm_data(fresh_kernel, lambda d: d.get("default") == "debug" and d.get("busy") is False)
    assert fresh_kernel.value("tpunb.current_mode()") == "debug"


def test_mode_changes_in_cells_reach_the_page_while_the_cell_runs(fresh_kernel: Kernel) -> None:
    load_and_open(fresh_kernel)
    msg_id = fresh_kernel.client.execute("%%tpu_mode debug\nimport time; time.sleep(2)")
    during = comm_data(fresh_kernel, lambda d: d.get("mode") == "debug")
    assert during[-1]["busy"] is True and during[-1]["default"] == "strict"
    fresh_kernel.collect(msg_id)
    comm_data(fresh_kernel, lambda d: d.get("mode") == "strict" and d.get("busy") is False)
    fresh_kernel.run("%tpu_mode compile")
    comm_data(fresh_kernel, lambda d: d.get("default") == "compile")


def test_a_bad_pick_is_refused_with_the_accepted_modes(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    request(fresh_kernel, comm_id, {"type": "set_mode", "mode": "turbo"})
    error = comm_data(fresh_kernel, lambda d: d.get("type") == "error")[-1]
    assert error["message"] == "unknown mode 'turbo'; valid modes: debug, strict, fused, compile"
    assert fresh_kernel.value("tpunb.current_mode()") == "strict"


def test_a_reloaded_page_finds_the_comm_and_opens_its_own(fresh_kernel: Kernel) -> None:
    info = fresh_kernel.client.comm_info(target_name="tpunb", reply=True)
    assert info["content"]["comms"] == {}  # tpunb not loaded: the page stays quiet
    first_id, _ = load_and_open(fresh_kernel)
    info = fresh_kernel.client.comm_info(target_name="tpunb", reply=True)
    assert list(info["content"]["comms"]) == [first_id]
    page_id = uuid.uuid4().hex
    send_comm(fresh_kernel, "comm_open", {"comm_id": page_id, "target_name": "tpunb", "data": {}})
    state = comm_data(fresh_kernel, lambda d: d["_comm_id"] == page_id)[-1]
    assert state["type"] == "state" and state["default"] == "strict"
    # both pages hear of a change, and either can pick
    request(fresh_kernel, page_id, {"type": "set_mode", "mode": "fused"})
    seen = comm_data(fresh_kernel, lambda d: d.get("default") == "fused" and d["_comm_id"] == page_id)
    assert {d["_comm_id"] for d in seen if d.get("default") == "fused"} == {first_id, page_id}


def test_the_side_panel_gets_the_monitor_view_and_live_ticks(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    fresh_kernel.run("%tpu_mode fused")
    request(fresh_kernel, comm_id, {"type": "monitor", "open": True})
    view = comm_data(fresh_kernel, lambda d: d.get("type") == "monitor_view")[-1]
    assert "export default" in view["esm"] and "render" in view["esm"] and ".tpunb" in view["css"]
    assert fresh_kernel.run("tpunb.monitor()").error is None  # a notebook widget beside the panel
    assert tpunb_threads(fresh_kernel).count("tpunb-sampler") == 1  # one sampler feeds the status, both
    # (256 x 256: a group on tiny tensors would never compile, config.TINY_OPS)
    loop = "w = torch.randn(256, 256)\nfor _ in range(3):\n    y = (w @ w).relu().sum().item()"
    run = fresh_kernel.run(loop)
    assert run.error is None, run.error
    tick = comm_data(fresh_kernel, lambda d: d.get("type") == "monitor" and d["state"]["groups_total"] >= 3)
    group = tick[-1]["state"]["groups"][0]
    request(fresh_kernel, comm_id, {"type": "graph", "key": group["key"]})
    graph = comm_data(fresh_kernel, lambda d: d.get("type") == "graph")[-1]
    assert graph["key"] == group["key"] and graph["code"]
    request(fresh_kernel, comm_id, {"type": "monitor", "open": False})
    time.sleep(1)  # ticks in flight may still arrive; after that the panel gets none
    while True:
        try:
            fresh_kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
    fresh_kernel.run("z = (torch.ones(8) + 1).sum().item()")
    with pytest.raises(AssertionError, match="condition not met"):
        comm_data(fresh_kernel, lambda d: d.get("type") == "monitor", timeout=2)


def control_request(kernel: Kernel, comm_id: str, data: dict[str, Any]) -> str:
    """A request the way the page sends it while cells run (tpunb/lab_control.py): a comm-info
    request for the target on the control channel, carrying the request."""
    content = {"target_name": "tpunb", "tpunb": {**data, "comm_id": comm_id}}
    msg = kernel.client.session.msg("comm_info_request", content)
    kernel.client.control_channel.send(msg)
    return msg["header"]["msg_id"]


def test_a_hello_on_the_control_channel_reaches_tpunb_while_a_run_all_is_queued(fresh_kernel: Kernel) -> None:
    """Run All on a fresh kernel: the page's hello must not wait behind the queued cells."""
    comm_id, first = load_and_open(fresh_kernel, hello=False)
    assert first["control"] is True
    running = fresh_kernel.client.execute("%%tpu_mode debug\nimport time; time.sleep(4)")
    queued = fresh_kernel.client.execute("time.sleep(2)")
    time.sleep(0.5)  # the cell has started; no page has said hello, so nothing is sent yet
    sent = time.monotonic()
    msg_id = control_request(fresh_kernel, comm_id, {"type": "hello"})
    live = comm_data(fresh_kernel, lambda d: d.get("type") == "state" and d["mode"] == "debug", timeout=3)
    assert live[-1]["busy"] is True and time.monotonic() - sent < 3  # the running cell's mode, now
    # ipykernel still answers the comm-info request itself, and its busy/idle names that type,
    # which JupyterLab ignores (so its kernel indicator stays busy under the running cell)
    reply = fresh_kernel.client.get_control_msg(timeout=5)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert list(reply["content"]["comms"]) == [comm_id]
    fresh_kernel.collect(running)
    fresh_kernel.collect(queued)
    assert tpunb_threads(fresh_kernel).count("tpunb-sampler") == 1


def test_a_pick_on_the_control_channel_applies_from_the_next_cell(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    running = fresh_kernel.client.execute("import time; time.sleep(3); print('ran in', tpunb.current_mode())")
    queued = fresh_kernel.client.execute("print('next in', tpunb.current_mode())")
    comm_data(fresh_kernel, lambda d: d.get("busy") is True)
    control_request(fresh_kernel, comm_id, {"type": "set_mode", "mode": "fused"})
    waiting = comm_data(fresh_kernel, lambda d: d.get("pending") == "fused", timeout=2)[-1]
    assert waiting["busy"] is True and waiting["default"] == "strict"
    assert "ran in strict" in fresh_kernel.collect(running).stdout  # never halfway through a cell
    assert "next in fused" in fresh_kernel.collect(queued).stdout  # the next queued cell, not the last
    # with no cell running, a pick made there applies at once on the notebook thread: the page
    # sends on control until a cell's reply reaches it, after the kernel has ended the cell
    # (such a pick waited for the next cell, however long that took; a browser test's race)
    control_request(fresh_kernel, comm_id, {"type": "set_precision", "precision": "bf16"})
    # (a bound, not a speed: it applies on the kernel's next loop turn, which took over 5 s once
    # on a loaded 2-core machine under ipykernel 6.29, with every sampler tick still pending)
    applied = comm_data(fresh_kernel, lambda d: d.get("precision") == "bf16", timeout=20)[-1]
    assert applied["busy"] is False and applied["pending_precision"] is None
    assert "bf16" in fresh_kernel.run("print(tpunb.stats()['precision'])").stdout
    # a bad pick is refused as on the shell channel; requests that run code are not served there
    control_request(fresh_kernel, comm_id, {"type": "set_mode", "mode": "turbo"})
    error = comm_data(fresh_kernel, lambda d: d.get("type") == "error")[-1]
    assert error["message"].startswith("unknown mode 'turbo'")
    control_request(fresh_kernel, comm_id, {"type": "graph", "key": "x"})
    error = comm_data(fresh_kernel, lambda d: d.get("type") == "error")[-1]
    assert error["message"] == "tpunb: 'graph' is not served on control"


def test_unloading_gives_the_kernel_its_own_comm_info_handler_back(fresh_kernel: Kernel) -> None:
    comm_id, _ = load_and_open(fresh_kernel)
    handler = "get_ipython().kernel.control_handlers['comm_info_request']"
    assert fresh_kernel.value(f"{handler}.__qualname__") == "ControlRequests._serve"
    assert fresh_kernel.run("%unload_ext tpunb").error is None
    assert fresh_kernel.value(f"{handler} == get_ipython().kernel.comm_info_request") is True
    control_request(fresh_kernel, comm_id, {"type": "hello"})
    assert fresh_kernel.client.get_control_msg(timeout=5)["content"]["status"] == "ok"
