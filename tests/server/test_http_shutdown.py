"""SIGTERM on a live server: stop accepting, finish admitted and queued work, exit 0."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.server.live import DATA, LONG_TEXT, LiveServer, in_thread


def test_sigterm_drains_admitted_and_queued_work(server_logs: Path) -> None:
    server = LiveServer(DATA / "drain.json", server_logs).start()  # piper, 1 slot, loaded at startup
    try:
        assert server.model("piper")["loaded"] is True
        clients = [server.client() for _ in range(2)]
        running = in_thread(lambda: clients[0].post("/v1/audio/speech", json={"model": "piper", "input": LONG_TEXT}))
        server.wait_for("piper", lambda r: r["active_slots"] == 1)
        queued = in_thread(lambda: clients[1].post("/v1/audio/speech", json={"model": "piper", "input": "Still here.", "seed": 5}))
        server.wait_for("piper", lambda r: r["queued_requests"] == 1)

        server.signal()
        sent = time.monotonic()
        # the listener closes at once: new connections are refused while the old work drains
        refused = False
        while time.monotonic() - sent < 5 and not refused:
            try:
                httpx.get(server.url + "/health", timeout=1.0)
                time.sleep(0.05)
            except httpx.TransportError:
                refused = True
        assert refused, "the server kept accepting connections after SIGTERM"
        assert not running.done(), "the running request finished before the check; use a longer text"

        assert running.result(timeout=120).status_code == 200
        late = queued.result(timeout=120)
        assert late.status_code == 200 and late.content[:4] == b"RIFF"
        assert server.proc is not None
        assert server.proc.wait(60) == 0
        assert "shutting down" in server.log()
        for c in clients:
            c.close()
    finally:
        server.stop()
