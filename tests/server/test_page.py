"""The web page at ``/``, in headless Chromium, against a live (gated) server.

Chromium is Debian's package, driven by Debian's ``chromedriver`` through
selenium (the ``test`` extra): nothing is downloaded at run time. Without
them the browser tests skip with the reason; under ``CI=true`` they fail,
since ``.ci/run`` installs them. The page's own files are checked without a
browser too.

The browser tests share one server and one page, in file order: speak a
sentence and get playable audio; upload ``hello.wav`` and see "hello" and
its speech segments; hold piper's session work at the gate
(tests/server/gated.py) while the page and two other clients ask for speech,
and see the live view show both slots busy and one request queued, then idle
again once the gate opens (the README's screenshot is taken there); record
from Chromium's fake microphone and see the server's answer on the page.
``VOXPOOL_PAGE_SCREENSHOT=docs/images/page.png`` writes the screenshot there.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config import embedded_default
from tests.ci import skip_or_fail
from tests.server.gated import HANG_GUARD_S, GatedServer, serving, wait_until
from tests.server.live import HELLO_WAV, LiveServer, in_thread

SCREEN_WIDTH = 1280

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    # a fake microphone (a beep) that needs no permission prompt
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    f"--window-size={SCREEN_WIDTH},1000",
)

CONFIG = {
    "models": [
        {"id": "piper", "family": "piper", "mode": "streaming", "slots": 2},
        {"id": "whisper", "family": "whisper", "slots": 2},
        {"id": "silero_vad", "family": "silero_vad", "slots": 32, "batching": True},
    ]
}
"""The embedded default of ``voxpool serve --parallel-jobs`` (checked below): three models,
two slots each for piper and whisper, silero_vad batched on 32 engine rows."""


def test_the_config_is_the_embedded_default() -> None:
    models = [(m.id, m.family, m.slots, m.batching) for m in embedded_default().models]
    assert models == [
        (m["id"], m["family"], m["slots"], m.get("batching", False)) for m in CONFIG["models"]
    ]


def browser_or_skip() -> tuple[str, str]:
    """Chromium's and chromedriver's paths; skips (fails under ``CI=true``) without them."""
    chromium = (
        os.environ.get("VOXPOOL_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )
    driver = os.environ.get("VOXPOOL_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = []
    if chromium is None:
        missing.append("Chromium (apt-get install chromium)")
    if driver is None:
        missing.append("chromedriver (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing or chromium is None or driver is None:
        reason = "the headless Chromium page test needs " + ", ".join(missing)
        skip_or_fail(reason, needs="Chromium, chromedriver and selenium")
    return chromium, driver


# ------------------------------------------------------------------ without a browser
def test_the_page_and_its_assets_are_served_same_origin(main_server: LiveServer) -> None:
    with main_server.client(timeout=HANG_GUARD_S) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["x-request-id"]
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "connect-src 'self'" in csp
        assert "media-src 'self' blob:" in csp
        assets = re.findall(r'(?:src|href)="(/[^"]+)"', page.text)
        assert sorted(assets) == ["/page/app.js", "/page/style.css"]
        types = {"/page/app.js": "text/javascript", "/page/style.css": "text/css"}
        for path in assets:
            resp = client.get(path)
            assert resp.status_code == 200, path
            assert resp.headers["content-type"].startswith(types[path])
            assert resp.headers["x-content-type-options"] == "nosniff"
        script = client.get("/page/app.js").text
        # only this server's API, by relative URL: no other origin, no framework
        assert not re.search(r"https?://", script.replace("http://www.w3.org/2000/svg", ""))
        assert client.head("/").status_code == 200
        missing = client.get("/page/nope.js")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert client.post("/").status_code == 405


# ------------------------------------------------------------------ in Chromium
@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatedServer]:
    browser_or_skip()
    folder = tmp_path_factory.mktemp("page")
    config = folder / "default.json"
    config.write_text(json.dumps(CONFIG))
    with serving(config, folder) as server:
        yield server


@pytest.fixture(scope="module")
def browser(page_server: GatedServer) -> Iterator[Any]:
    with chromium(page_server.url + "/") as driver:
        wait_until("the page to list the models", lambda: len(models_shown(driver)) == 3)
        yield driver


@contextlib.contextmanager
def chromium(url: str) -> Iterator[Any]:
    """A headless Chromium (fake microphone, own profile) with ``url`` open; quit after."""
    binary, driver_path = browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile = tempfile.mkdtemp(prefix="voxpool-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        driver.set_script_timeout(HANG_GUARD_S)
        driver.get(url)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def models_shown(driver: Any) -> list[str]:
    return list(
        js(
            driver,
            "return Array.from(document.querySelectorAll('#models .model'), m => m.dataset.model)",
        )
    )


def live(driver: Any, model: str) -> dict[str, Any]:
    """What the live view shows for ``model``: state, counters and each slot lane's busy flag."""
    return dict(
        js(
            driver,
            """
            const card = document.querySelector(`#models .model[data-model="${arguments[0]}"]`);
            if (!card) return {};
            return {
              state: card.dataset.state,
              active: Number(card.dataset.active),
              queued: Number(card.dataset.queued),
              lanes: Array.from(card.querySelectorAll('g.slot'), g => g.dataset.busy === 'true'),
              busy_bars: card.querySelectorAll('g.slot rect.busy').length,
              head: card.querySelector('.model-head').textContent,
            };
            """,
            model,
        )
    )


def status(driver: Any, element: str) -> tuple[str, str, int]:
    """A status line's ``data-state`` (busy, ok, error), text and run number (``data-run``)."""
    got = js(
        driver,
        "const e = document.getElementById(arguments[0]); "
        "return [e.dataset.state || '', e.textContent, Number(e.dataset.run || 0)];",
        element,
    )
    return str(got[0]), str(got[1]), int(got[2])


def wait_done(driver: Any, element: str, after: int) -> tuple[str, str]:
    """Wait for a run numbered above ``after`` to finish on a status line: its state and text."""

    def done() -> tuple[str, str] | None:
        state, text, run = status(driver, element)
        return (state, text) if run > after and state in ("ok", "error") else None

    return wait_until(f"#{element} to finish run {after + 1}", done)


def speech_audio(driver: Any) -> dict[str, Any]:
    return dict(
        js(
            driver,
            """
            const a = document.getElementById('speech-audio');
            return {
                src: a.src, bytes: Number(a.dataset.bytes || 0),
                duration: a.duration, ready: a.readyState
            };
            """,
        )
    )


def request_log(driver: Any) -> list[list[str]]:
    """The page's "Requests from this page" rows, newest first: [time, request, status, ms, id]."""
    return [
        list(row)
        for row in js(
            driver,
            "return Array.from(document.querySelectorAll('#request-log tbody tr'), "
            "r => Array.from(r.cells, c => c.textContent));",
        )
    ]


def test_typing_a_sentence_and_clicking_speak_plays_it(
    browser: Any, page_server: GatedServer
) -> None:
    text = browser.find_element("id", "tts-text")
    text.clear()
    text.send_keys("The page speaks this sentence.")
    wait_until("the speak button", lambda: browser.find_element("id", "speak-button").is_enabled())
    run = status(browser, "speak-status")[2]
    browser.find_element("id", "speak-button").click()
    state, message = wait_done(browser, "speak-status", run)
    assert state == "ok", message
    audio = wait_until("the audio to load", lambda: (a := speech_audio(browser))["duration"] and a)
    assert audio["src"].startswith("blob:")
    assert audio["bytes"] > 44  # a WAV with samples
    assert 0.5 < audio["duration"] < 10, audio  # about two seconds of speech
    assert "of speech in" in message
    # the page names the request's id; the server's access log has the request under it
    row = next(r for r in request_log(browser) if r[1] == "POST /v1/audio/speech")
    assert row[2] == "200" and row[4] in message
    wait_until(
        "the speech request's access line",
        lambda: re.search(
            rf"voxpool\.access: POST /v1/audio/speech 200 \S+ms model=piper id={row[4]}$",
            page_server.log(),
            re.MULTILINE,
        ),
    )


def test_an_uploaded_file_shows_its_transcript_and_speech_segments(browser: Any) -> None:
    run = status(browser, "listen-status")[2]
    browser.find_element("id", "audio-file").send_keys(str(HELLO_WAV))
    state, message = wait_done(browser, "listen-status", run)
    assert state == "ok", message
    transcript = browser.find_element("id", "transcript").text
    assert "hello" in transcript.lower(), transcript
    segments = js(
        browser,
        "return Array.from(document.querySelectorAll('#vad-segments li.segment'), "
        "li => [Number(li.dataset.start), Number(li.dataset.end)]);",
    )
    assert segments, "no speech segments shown"
    assert all(0 <= start < end <= 1.0 for start, end in segments), segments  # hello.wav: 0.82 s
    drawn = js(browser, "return document.querySelectorAll('#segments-svg rect').length")
    assert drawn >= 2 + len(
        segments
    )  # two lane backgrounds, a bar per segment (and per text segment)


def test_the_live_view_shows_slots_busy_and_the_queue_while_requests_run(
    browser: Any, page_server: GatedServer, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "window")).select_by_value("15")  # the last 15 s
    wait_until("piper idle on the page", lambda: live(browser, "piper").get("active") == 0)
    before = live(browser, "piper")
    assert before["lanes"] == [False, False] and before["queued"] == 0
    speeches = sum(r[1] == "POST /v1/audio/speech" for r in request_log(browser))

    def other_client(text: str) -> Any:
        return httpx.post(
            page_server.url + "/v1/audio/speech",
            json={"model": "piper", "input": text},
            timeout=HANG_GUARD_S,
        )

    run = status(browser, "speak-status")[2]
    with page_server.held("piper") as step:
        # the page's own request: held in its slot
        browser.find_element("id", "speak-button").click()
        page_server.wait_arrived("piper", step + 1)
        others = [
            in_thread(functools.partial(other_client, text))
            for text in ("A second client.", "A third one.")
        ]
        page_server.wait_arrived("piper", step + 2)  # the third waits in the queue
        shown = wait_until(
            "the page to show two busy slots and one queued request",
            lambda: (v := live(browser, "piper"))["active"] == 2 and v["queued"] == 1 and v,
        )
        assert shown["lanes"] == [True, True]
        assert shown["busy_bars"] >= 2
        assert "2/2 slots busy · 1 queued" in shown["head"]
        assert status(browser, "speak-status")[:3:2] == ("busy", run + 1)
        target = os.environ.get("VOXPOOL_PAGE_SCREENSHOT")
        if target:  # for the README: let the held requests' bars grow to a couple of seconds
            wait_until("wide bars", lambda: held_bar_width(browser, "piper") > 130)
        shot = screenshot(browser, tmp_path / "page.png")
    for other in others:
        assert other.result(timeout=HANG_GUARD_S).status_code == 200
    state, message = wait_done(browser, "speak-status", run)
    assert state == "ok", message
    after = wait_until(
        "the page to show piper idle", lambda: (v := live(browser, "piper"))["active"] == 0 and v
    )
    assert after["lanes"] == [False, False] and after["queued"] == 0
    assert after["busy_bars"] >= 2  # the busy spans stay on the timeline
    assert sum(r[1] == "POST /v1/audio/speech" for r in request_log(browser)) == speeches + 1
    assert shot.read_bytes().startswith(b"\x89PNG")
    if target:
        shutil.copyfile(shot, target)


def held_bar_width(driver: Any, model: str) -> float:
    """The width (SVG units) of the last busy bar on the model's last slot lane."""
    return float(
        js(
            driver,
            """
            const bars = document.querySelectorAll(
              `#models .model[data-model="${arguments[0]}"] g.slot:last-of-type rect.busy`);
            return bars.length ? Number(bars[bars.length - 1].getAttribute('width')) : 0;
            """,
            model,
        )
    )


def screenshot(driver: Any, path: Path) -> Path:
    """The whole page as a PNG, beyond the window's height (DevTools' captureScreenshot)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def test_a_microphone_recording_reaches_the_server_and_its_answer_is_shown(browser: Any) -> None:
    """Chromium's fake microphone; MediaRecorder makes webm/opus. A server that decodes it
    answers with a transcript; one that does not, with a 400 the page shows as it came."""
    button = browser.find_element("id", "record-button")
    run = status(browser, "listen-status")[2]
    button.click()
    wait_until(
        "recorded bytes",
        lambda: (
            int(browser.find_element("id", "record-status").get_attribute("data-bytes") or 0) > 4000
        ),
    )
    assert button.text == "Stop"
    button.click()
    state, message = wait_done(browser, "listen-status", run)
    assert button.text == "Record"
    rows = request_log(browser)[:2]
    assert sorted(r[1] for r in rows) == ["POST /v1/audio/transcriptions", "POST /v1/audio/vad"]
    if state == "ok":
        assert all(r[2] == "200" for r in rows), rows
        assert browser.find_element("id", "transcript").get_attribute("data-state") == "ok"
    else:
        # the server's own message, its status and both request ids, not a browser failure
        assert all(r[2].startswith("4") for r in rows), rows
        assert re.search(r"\(HTTP 4\d\d", message), message
        assert all(r[4] in message for r in rows), (rows, message)
        assert "unreachable" not in message
