"""The console in a real browser (issue 30): headless Chromium (Debian's package, which
``.ci/run`` installs) loads the page against a live worker and polls with it; the DOM it
renders shows each served model with a non-zero req/s, a rolled-back rollout with its
reason, and a dead letter after a poison request. It saves a screenshot (set
``BATCHFLEET_CONSOLE_SCREENSHOT=docs/console.png`` to refresh the one in the docs)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers import AsyncClient
from batchfleet.producers.console.settings import ConsoleSettings
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import ModelVersion, TensorSpec
from tests.e2e.test_console import ROWS, traffic, two_model_worker
from tests.support.console import chromium, dump_dom, live_console, screenshot
from tests.support.models import POISON

BROWSER = chromium()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    BROWSER is None, reason="no chromium on PATH (apt-get install chromium; CI has it)")]

#: Seconds of live figures before the screenshot (the sparklines' kept points are 10 s apart).
SPARK_S = 12.0
REASON = "canary p99 over the guard's limit"
F10, F1 = TensorSpec("float32", (10,)), TensorSpec("float32", (1,))


class Page(HTMLParser):
    """What the test reads off the rendered DOM: each model row's cells by class, the
    rollout cards' text, the dead-letter rows' request IDs."""

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, dict[str, str]] = {}
        self.rollouts: dict[str, str] = {}
        self.letters: set[str] = set()
        #: Models with an output-statistics card (issue 27's panel).
        self.outputs: set[str] = set()
        self._row: str | None = None
        self._cell: str | None = None
        self._card: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if self._card is not None:
            self._depth += tag == "div"
        if tag == "div" and a.get("data-outputs-model"):
            self.outputs.add(a["data-outputs-model"] or "")
        if tag == "tr" and a.get("data-model"):
            self._row = a["data-model"]
            self.models[self._row or ""] = {}
        elif tag == "tr" and a.get("data-request-id"):
            self.letters.add(a["data-request-id"] or "")
        elif tag == "td" and self._row is not None:
            self._cell = (a.get("class") or "").split(" ")[-1]
        elif tag == "div" and "rollout" in (a.get("class") or "") and a.get("data-model"):
            self._card, self._depth = a["data-model"], 1
            self.rollouts[self._card or ""] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "td":
            self._cell = None
        elif tag == "div" and self._card is not None:
            self._depth -= 1
            if self._depth == 0:
                self._card = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell:
            self.models[self._row][self._cell] = data.strip()
        if self._card is not None:
            self.rollouts[self._card] += data


def _read(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


async def _rolled_back_rollout(redis_url: str) -> Any:
    """A model "ranker" with two versions on a (beating) worker; its canary rolled back."""
    registry = open_model_registry(redis_url, Names("bf"))
    versions = [ModelVersion(label, f"sha256:{label}", F10, F1) for label in ("default", "v2")]
    await registry.serve("w-ranker", {"ranker": versions})
    await registry.set_policy("ranker", stable="default", canary="v2", percent=10,
                              who="deployer", why="ship v2")
    await registry.rollback("ranker", who="guard", why=REASON)
    await registry.close()


def _rate(page: Page, model: str) -> float:
    """The model row's req/s cell; 0 where missing or a dash."""
    text = page.models.get(model, {}).get("rps", "").replace(",", "")
    return float(text) if text.replace(".", "", 1).isdigit() else 0.0


def _served(page: Page, poison_id: str) -> bool:
    return (_rate(page, "demo-mlp") > 0 and _rate(page, "poison") > 0
            and REASON in page.rollouts.get("ranker", "") and poison_id in page.letters
            and {"demo-mlp", "poison"} <= page.outputs)


async def test_the_page_in_chromium_shows_rates_a_rollback_reason_and_a_dead_letter(
        redis_url: str, tmp_path: Path) -> None:
    assert BROWSER is not None
    await _rolled_back_rollout(redis_url)
    beats = RedisHeartbeats(redis_client(redis_url), Names("bf"))
    # one-second statistics windows, so the output panel fills while the page is up
    async with two_model_worker(redis_url, stats_window_s=1) as _, AsyncClient(redis_url) as client:
        bad = ROWS[:1].copy()
        bad[0, 0] = POISON
        (poison_id,) = await client.submit_many("poison", bad)
        assert (await client.wait(poison_id, timeout=30)).status == "failed"
        stop = asyncio.Event()
        producers = [asyncio.create_task(traffic(client, m, stop))
                     for m in ("demo-mlp", "poison")]
        with live_console(ConsoleSettings(broker=redis_url, refresh_s=1.0)) as base:
            started = time.monotonic()
            deadline, page = started + 90, Page()
            while time.monotonic() < deadline:
                html = await asyncio.to_thread(dump_dom, BROWSER, base)
                page = _read(html)
                if _served(page, poison_id):
                    break
                await asyncio.sleep(0.5)
            # a few more seconds of traffic, so the screenshot's sparklines have a shape
            await asyncio.sleep(max(0.0, SPARK_S - (time.monotonic() - started)))
            shot = tmp_path / "console.png"
            await asyncio.to_thread(screenshot, BROWSER, base, shot)
        stop.set()
        for task in producers:
            await task
    await beats.forget("w-ranker")
    assert page.models, "the page rendered no model rows"
    assert _served(page, poison_id), (page.models, page.rollouts, page.letters, page.outputs)
    assert shot.stat().st_size > 10_000
    if target := os.environ.get("BATCHFLEET_CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, target)
