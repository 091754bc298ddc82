"""A real JupyterLab on localhost and Debian's Chromium driven by Playwright.

No browser download: Playwright is pointed at the system ``chromium``. Tests skip (with the
reason) only where no chromium is installed; ``make test`` installs it when run as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_CONFIG = """
from jupyterlab.galata import configure_jupyter_server
configure_jupyter_server(c)
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = {port}
c.ServerApp.root_dir = {root!r}
c.ServerApp.allow_root = True
c.ServerApp.open_browser = False
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, the server's root folder) of a JupyterLab running for this test."""
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (make test installs it when run as root)")
    port = _free_port()
    root = tmp_path / "lab"
    root.mkdir()
    config = tmp_path / "jupyter_server_test_config.py"
    config.write_text(SERVER_CONFIG.format(port=port, root=str(root)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError as error:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(
                        f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}"
                    ) from error
                time.sleep(0.5)
        yield url, root
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def page():
    """A Chromium page (headless, the system browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()
