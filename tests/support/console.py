"""``live_console()``: the console app under a real uvicorn on a free loopback port, in a
thread (as ``live_gateway``); ``chromium()``: the headless browser, when installed."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from batchfleet.connectors.embedded_server import free_port
from batchfleet.producers.console.app import create_console_app
from batchfleet.producers.console.sessions import KeySource
from batchfleet.producers.console.settings import ConsoleSettings


@contextmanager
def live_console(settings: ConsoleSettings, keys: KeySource | None = None) -> Iterator[str]:
    """Serve the console for ``settings`` (its host decides loopback rules, the server
    itself listens on 127.0.0.1); yields the base URL with its trailing slash."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_console_app(settings, keys),
                                           host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("console did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(20)


def chromium() -> str | None:
    """The headless browser (Debian's ``chromium``), or None when it is not installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def _run(browser: str, url: str, *args: str, budget_ms: int, timeout_s: float
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-extensions",
         "--no-first-run", "--disable-dev-shm-usage", f"--virtual-time-budget={budget_ms}",
         *args, url], capture_output=True, text=True, timeout=timeout_s, check=False)


def dump_dom(browser: str, url: str, budget_ms: int = 4000, timeout_s: float = 60) -> str:
    """The DOM after the page ran ``budget_ms`` of (virtual) time: its first polls."""
    return _run(browser, url, "--dump-dom", budget_ms=budget_ms, timeout_s=timeout_s).stdout


def screenshot(browser: str, url: str, path: Path, size: str = "1400,1500",
               budget_ms: int = 4000, timeout_s: float = 60) -> None:
    done = _run(browser, url, f"--screenshot={path}", f"--window-size={size}",
                "--hide-scrollbars", budget_ms=budget_ms, timeout_s=timeout_s)
    if not path.exists():
        raise RuntimeError(f"no screenshot: {done.stderr[-2000:]}")
