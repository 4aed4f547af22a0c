"""The web page's live voice activity (``/v1/audio/vad/live``) in headless Chromium.

Chromium's fake microphone (a beep) is captured at 16 kHz, sent over the
WebSocket as 16-bit PCM while the page draws each chunk's probability; Stop
sends ``end`` and the page shows the summary once the server closes 1000; the
model's slot is free again. A model without batching is not offered. As the
other page tests, it skips without Chromium, chromedriver and selenium (and
fails under ``CI=true``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.gated import HANG_GUARD_S, wait_until
from tests.server.live import LiveServer
from tests.server.test_page import browser_or_skip, chromium, js, status, wait_done

CONFIG = {
    "models": [
        {"id": "vad", "family": "silero_vad", "slots": 2, "batching": True},
        {"id": "plain_vad", "family": "silero_vad", "slots": 1},
    ]
}


@pytest.fixture(scope="module")
def server(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    browser_or_skip()
    config = tmp_path_factory.mktemp("page-live") / "live.json"
    config.write_text(json.dumps(CONFIG))
    live = LiveServer(config, server_logs).start()
    try:
        yield live
    finally:
        assert live.stop() == 0, live.log()[-4000:]


@pytest.fixture(scope="module")
def browser(server: LiveServer) -> Iterator[Any]:
    with chromium(server.url + "/") as driver:
        yield driver


def live_state(driver: Any) -> dict[str, Any]:
    return dict(
        js(
            driver,
            """
            const s = document.getElementById('live-status');
            const b = document.getElementById('live-button');
            return {
              models: Array.from(document.getElementById('live-model').options, o => o.value),
              button: b.textContent, disabled: b.disabled,
              chunks: Number(s.dataset.chunks || 0), close: s.dataset.close || '',
              bars: document.querySelectorAll('#live-svg rect').length,
            };
            """,
        )
    )


def test_the_microphone_streams_live_and_the_summary_is_shown(
    server: LiveServer, browser: Any
) -> None:
    wait_until("the page to offer the batching VAD model", lambda: live_state(browser)["models"])
    assert live_state(browser)["models"] == ["vad"]  # plain_vad has no batching
    wait_until("the Start button", lambda: not live_state(browser)["disabled"])
    run = status(browser, "live-status")[2]
    browser.find_element("id", "live-button").click()
    wait_until("a second of probabilities", lambda: live_state(browser)["chunks"] >= 31)
    shown = live_state(browser)
    assert shown["button"] == "Stop" and shown["bars"] > 1, shown
    assert server.model("vad")["active_slots"] == 1
    browser.find_element("id", "live-button").click()
    state, message = wait_done(browser, "live-status", run)
    shown = live_state(browser)
    assert (state, shown["close"], shown["button"]) == ("ok", "1000", "Start"), (message, shown)
    assert "chunks" in message and "heard" in message, message
    server.wait_idle("vad", timeout=HANG_GUARD_S)
