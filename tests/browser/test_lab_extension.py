"""tpunb's JupyterLab extension in a real JupyterLab and Chromium: the status item, the
toolbar's mode picker (also while a cell runs), the side-panel monitor, a kernel restart.

The extension is the installed ``tpunb-lab`` package (``make test`` installs it from
``extension/``), exactly as a user's JupyterLab loads it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
from test_monitor_browser import ARTIFACTS, dismiss_news_toast

CELLS = [
    "%load_ext tpunb",
    "%tpu_mode debug",
    "import tpunb\nprint('mode is', tpunb.current_mode())",
    "import time\nprint('started', flush=True)\ntime.sleep(8)\nprint('slept in', tpunb.current_mode())",
    "print('now in', tpunb.current_mode())",
]
STATUS = ".tpunb-ModeStatus"
PICKER = ".tpunb-ModePicker-mode"
PRECISION = ".tpunb-PrecisionPicker"
NOTE = ".tpunb-ModePicker-note"
APP = "window.jupyterapp.shell.currentWidget"


def wait_kernel_idle(page) -> None:
    kernel = f"{APP}?.sessionContext?.session?.kernel"
    page.wait_for_function(f"() => {kernel}?.status === 'idle'", timeout=120_000)


def run_cell(page, index: int) -> None:
    page.evaluate(
        f"() => {{ {APP}.content.activeCellIndex = {index};"
        " window.jupyterapp.commands.execute('notebook:run-cell'); }"
    )


def printed(page, index: int, line: int = 0, timeout_ms: int = 60_000) -> str:
    """Wait for cell ``index`` to have printed ``line + 1`` lines, and return that one (what
    the cell printed; tpunb's summary line comes after it)."""
    query = f"{APP}.content.widgets[{index}].outputArea.node.innerText.trim().split('\\n')"
    page.wait_for_function(f"() => ({query}).filter(l => l.length > 0).length > {line}", timeout=timeout_ms)
    return [text for text in page.evaluate(f"() => {query}") if text][line]


def status_text(page) -> str:
    return page.locator(STATUS).inner_text()


def wait_status(page, pattern: str, timeout_ms: int = 10_000) -> str:
    page.wait_for_function(
        f"() => new RegExp({pattern!r}).test(document.querySelector({STATUS!r})?.textContent ?? '')",
        timeout=timeout_ms,
    )
    return status_text(page)


def test_status_item_and_mode_picker_follow_the_kernel(lab, page):
    url, root = lab
    write_notebook(root / "modes.ipynb", CELLS)
    page.goto(f"{url}/lab/tree/modes.ipynb")
    dismiss_news_toast(page)
    wait_kernel_idle(page)

    # a kernel without tpunb: no status item, no picker
    assert not page.locator(STATUS).is_visible()
    assert not page.locator(PICKER).is_visible()

    run_cell(page, 0)
    text = wait_status(page, "^tpunb · strict · host RSS ", timeout_ms=60_000)
    assert re.fullmatch(r"tpunb · strict · host RSS \d+ MiB / [\d.]+ GiB", text), text
    assert page.locator(PICKER).input_value() == "strict"
    options = page.locator(f"{PICKER} option").all_inner_texts()
    assert options == ["debug", "strict", "fused", "compile"]

    # the precision picker: what this runtime accepts; a pick shows in the status item
    assert page.locator(f"{PRECISION} option").all_inner_texts() == ["fp32", "bf16"]
    assert page.locator(PRECISION).input_value() == "fp32"
    page.locator(PRECISION).select_option("bf16")
    wait_status(page, "^tpunb · strict · bf16 · host RSS ")
    page.locator(PRECISION).select_option("fp32")
    wait_status(page, "^tpunb · strict · host RSS ")

    run_cell(page, 1)  # %tpu_mode debug moves both
    wait_status(page, "^tpunb · debug · ")
    page.wait_for_function(f"() => document.querySelector({PICKER!r}).value === 'debug'")

    page.locator(PICKER).select_option("fused")  # through the comm, no code in the notebook
    wait_status(page, "^tpunb · fused · ")
    run_cell(page, 2)
    assert printed(page, 2) == "mode is fused"
    sources = page.evaluate(f"() => {APP}.content.widgets.map(c => c.model.sharedModel.source)")
    assert sources == CELLS

    # picking while a cell runs: the cell keeps its mode, the picker says the pick waits.
    # Pick once the cell has started in the kernel, not when the page shows it queued: a
    # queued cell may wait for fused mode's background imports (fuse/warmup.py).
    run_cell(page, 3)
    assert printed(page, 3) == "started"
    page.locator(PICKER).select_option("strict")
    page.wait_for_function(
        f"() => (document.querySelector({NOTE!r})?.textContent ?? '').includes('from the next cell')",
        timeout=5_000,
    )
    note = page.locator(NOTE).inner_text()
    assert note == "strict from the next cell (this one keeps running in fused)", note
    assert page.locator(PICKER).input_value() == "strict"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-extension-pending-pick.png"))
    assert printed(page, 3, line=1, timeout_ms=30_000) == "slept in fused"
    wait_status(page, "^tpunb · strict · ")
    page.wait_for_function(f"() => document.querySelector({NOTE!r}).textContent === ''")
    run_cell(page, 4)
    assert printed(page, 4) == "now in strict"

    # the status item opens the live monitor in the side panel
    page.locator(STATUS).click()
    panel = page.locator("#tpunb-monitor")
    panel.locator(".tpunb-monitor").wait_for(timeout=15_000)
    page.wait_for_function(
        "() => /strict/.test(document.querySelector('#tpunb-monitor .tpunb-mode')?.textContent ?? '')",
        timeout=10_000,
    )
    page.screenshot(path=str(ARTIFACTS / "lab-extension-monitor-panel.png"))

    # a restart forgets tpunb until the new kernel loads it again
    page.evaluate(f"() => {APP}.sessionContext.session.kernel.restart()")
    page.wait_for_function(f"() => !document.querySelector({STATUS!r})?.offsetParent", timeout=30_000)
    assert not page.locator(PICKER).is_visible()
    assert "Load tpunb" in panel.inner_text()
    wait_kernel_idle(page)
    run_cell(page, 0)
    wait_status(page, "^tpunb · strict · ", timeout_ms=60_000)
    assert page.locator(PICKER).input_value() == "strict"
    # the open panel subscribes to the new kernel's monitor by itself
    panel.locator(".tpunb-monitor").wait_for(timeout=15_000)


def write_notebook(path: Path, cells: list[str]) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def open_notebook(page, path: str) -> None:
    """Open (or bring forward) a notebook; not awaited in the page: it resolves to a widget."""
    page.evaluate(f"() => {{ window.jupyterapp.commands.execute('docmanager:open', {{path: {path!r}}}); }}")
    page.wait_for_function(f"() => {APP}?.context?.path === {path!r}", timeout=30_000)
    wait_kernel_idle(page)


def test_switching_notebooks_and_reloading_the_page_keep_the_right_state(lab, page):
    url, root = lab
    write_notebook(root / "reload.ipynb", ["%load_ext tpunb\n%tpu_mode fused"])
    write_notebook(root / "plain.ipynb", ["print('no tpunb here')"])
    page.goto(f"{url}/lab/tree/reload.ipynb")
    dismiss_news_toast(page)
    wait_kernel_idle(page)
    run_cell(page, 0)
    wait_status(page, "^tpunb · fused · ", timeout_ms=60_000)
    page.reload()  # same kernel, new page: it asks the kernel for tpunb's comm
    wait_status(page, "^tpunb · fused · ", timeout_ms=120_000)
    assert page.locator(PICKER).input_value() == "fused"
    page.locator(PICKER).select_option("debug")
    wait_status(page, "^tpunb · debug · ")
    # another notebook, whose kernel has no tpunb: the item goes; back again: it returns
    open_notebook(page, "plain.ipynb")
    page.wait_for_function(f"() => !document.querySelector({STATUS!r})?.offsetParent", timeout=10_000)
    open_notebook(page, "reload.ipynb")
    wait_status(page, "^tpunb · debug · ")


def test_jupyterlab_lists_the_extension_as_enabled():
    """What a user checks after installing: the prebuilt extension is found and enabled."""
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, check=True
    )
    line = next((x for x in (listed.stdout + listed.stderr).splitlines() if "tpunb-lab" in x), "")
    assert re.search(r"tpunb-lab v\d+\.\d+\.\d+ .*enabled.*OK", line), listed.stdout + listed.stderr
