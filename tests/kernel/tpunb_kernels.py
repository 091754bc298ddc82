"""A real IPython kernel, started through jupyter_client, with tpunb importable.

The kernel runs with this interpreter (a kernelspec written to a temp dir), so it sees
the same virtual environment as the tests, whatever ``python`` is first on PATH.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

KERNEL_NAME = "tpunb-test"
VALUE_MARK = "@value@"
#: ``python -m ipykernel_launcher``, plus every thread's stack on SIGUSR1 (``Kernel.dump_stacks``)
#: and on a crash (``-X faulthandler``): a test that finds its kernel stuck or dead shows where.
KERNEL_MAIN = (
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "sys.path[0] == '' and sys.path.pop(0); "
    "from ipykernel import kernelapp; kernelapp.launch_new_instance()"
)


@dataclass
class CellResult:
    """What one execute_request produced."""

    stdout: str = ""
    stderr: str = ""
    error: dict | None = None  # ename, evalue, traceback (from the execute_reply)
    results: list[dict] = field(default_factory=list)  # execute_result data bundles
    displays: list[dict] = field(default_factory=list)  # display_data data bundles
    messages: list[dict] = field(default_factory=list)  # every IOPub message seen meanwhile

    @property
    def text(self) -> str:
        return "".join(r.get("text/plain", "") for r in self.results)


class Kernel:
    """A started kernel plus a blocking ``run(code)``."""

    def __init__(self, manager: KernelManager) -> None:
        self.manager = manager
        self.client = manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 120) -> CellResult:
        msg_id = self.client.execute(code)
        return self.collect(msg_id, timeout)

    def collect(self, msg_id: str, timeout: float = 120) -> CellResult:
        result = CellResult()
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                self.dump_stacks()
                raise TimeoutError(f"no idle status for {msg_id} after {timeout} s") from None
            result.messages.append(msg)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
            elif kind == "execute_result":
                result.results.append(content["data"])
            elif kind == "display_data":
                result.displays.append(content["data"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:  # the reply says whether the cell failed, UsageErrors included
            reply = self.client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if reply["content"]["status"] == "error":
            result.error = reply["content"]
        return result

    def interrupt_after(self, code: str, seconds: float) -> CellResult:
        """Run a cell, interrupt the kernel after ``seconds`` (SIGINT, like the stop button)."""
        msg_id = self.client.execute(code)
        time.sleep(seconds)
        self.manager.interrupt_kernel()
        return self.collect(msg_id)

    def value(self, expression: str):
        """Evaluate a JSON-able expression in the kernel and return it."""
        result = self.run(f"import json as _j; print('{VALUE_MARK}' + _j.dumps({expression}))")
        assert result.error is None, result.error
        line = next(x for x in result.stdout.splitlines() if x.startswith(VALUE_MARK))
        return json.loads(line.removeprefix(VALUE_MARK))

    def dump_stacks(self) -> None:
        """Have a stuck kernel print every thread's stack (to its stderr, which pytest shows
        with the failing test): ``KERNEL_MAIN`` registers the signal."""
        process = getattr(self.manager.provisioner, "process", None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def start_kernel(
    tmp_dir: Path,
    extra_arguments: list[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Kernel:
    """A kernel on this interpreter; ``env`` adds to its environment (TPUNB_RUNTIME, say),
    ``cwd`` is its working directory (the notebook's folder)."""
    spec_dir = tmp_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-X", "faulthandler", "-c", KERNEL_MAIN, "-f", "{connection_file}"],
        "display_name": "tpunb test kernel",
        "language": "python",
        "env": {"OMP_NUM_THREADS": "1", **(env or {})},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_dir / "kernels")])
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    manager.start_kernel(extra_arguments=extra_arguments or [], **({"cwd": str(cwd)} if cwd else {}))
    return Kernel(manager)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A fresh kernel with tpunb loaded."""
    started = start_kernel(tmp_path)
    loaded = started.run("%load_ext tpunb\nimport torch, tpunb")
    assert loaded.error is None, loaded.error
    yield started
    started.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A fresh kernel without tpunb loaded."""
    started = start_kernel(tmp_path)
    yield started
    started.shutdown()
