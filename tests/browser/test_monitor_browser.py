"""The monitor in a real JupyterLab: its readouts move while a fused training cell runs."""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from pathlib import Path

import nbformat

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"

CELLS = [
    "%load_ext tpunb\nimport torch\n"
    "model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    "data, labels = torch.randn(128, 256), torch.randint(0, 8, (128,))",
    "%tpu_monitor",
    "%%tpu_mode fused\nimport time\nstarted, kept = time.monotonic(), []\n"
    "while time.monotonic() - started < 20:\n"
    "    kept.append(torch.zeros(64 * 1024))  # 256 KiB a step: memory that visibly grows\n"
    "    loss = torch.nn.functional.cross_entropy(model(data), labels)\n"
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    loss.item()\nprint('done')",
]

STATUS_CELLS = ".tpunb-group-table tbody td.tpunb-col-status"
TRIGGER_CELLS = ".tpunb-group-table tbody td.tpunb-col-trigger"
#: What a row's status says (monitor.js STATUS_WORDS), never the engine's hit / miss / op by op.
PLAIN_STATUS = r"compiled|compiled now|first seen|compiling( \d+\.\ds)?|as strict|compile failed"

RUNNING = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'))"


def dismiss_news_toast(page) -> None:
    """JupyterLab asks about news in a toast that can cover the output; answer it if shown."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with contextlib.suppress(PlaywrightTimeout):
        page.get_by_role("button", name="No", exact=True).click(timeout=15_000)


def changes(values: list[str]) -> int:
    return sum(1 for a, b in itertools.pairwise(values) if a != b)


def readout(page, role: str) -> str:
    return page.evaluate(f"() => document.querySelector('[data-role={role}]')?.textContent ?? ''")


def test_monitor_readouts_change_while_the_cell_runs(lab, page):
    url, root = lab
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, root / "monitor.ipynb")
    page.goto(f"{url}/lab/tree/monitor.ipynb")
    dismiss_news_toast(page)
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'",
        timeout=120_000,
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_selector("[data-role=memory-text]", timeout=120_000)
    page.wait_for_function(RUNNING, timeout=60_000)
    memory, groups = [], []
    screenshot_taken = False
    started = time.monotonic()
    # Sample for 12 s of the cell's 20: the prompts' "[*]" is not a reliable end signal, since
    # JupyterLab's windowed rendering may take a scrolled-away cell out of the page.
    while time.monotonic() - started < 12:
        memory.append(readout(page, "memory-text"))
        groups.append(readout(page, "groups-count"))
        if not screenshot_taken and time.monotonic() - started > 8:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "monitor-running.png"), full_page=True)
            screenshot_taken = True
        time.sleep(0.5)
    assert changes(groups) >= 5, groups
    assert changes(memory) >= 5, memory
    assert screenshot_taken
    # each row in the user's words: its status plain, a hot call's or step's trigger as well
    statuses = page.evaluate(f"() => [...document.querySelectorAll({STATUS_CELLS!r})].map(c => c.innerText)")
    assert statuses and all(re.fullmatch(PLAIN_STATUS, text) for text in statuses), statuses
    triggers = page.evaluate(f"() => [...document.querySelectorAll({TRIGGER_CELLS!r})].map(c => c.innerText)")
    assert not [t for t in triggers if "hot:" in t or "-step" in t or "-training" in t], triggers
