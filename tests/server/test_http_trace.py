"""``--trace FILE`` on a live server, replayed: a fresh core makes the same decisions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.events import TraceRecord
from core.replay import PASSIVE_EVENTS, replay
from tests.server.live import AUTH, LONG_TEXT, ROOT, LiveServer, in_thread


def read_trace(path: Path) -> list[TraceRecord]:
    text = path.read_text()
    lines = text.split("\n")[:-1]  # only complete lines: the server is still writing
    return [TraceRecord.from_json(line) for line in lines]


def test_live_trace_replays_identically(main_server: LiveServer, trace_file: Path) -> None:
    """Queued requests on a one-slot model, an unload behind them, a reload: then the
    whole session's trace (every test so far on this server) is re-fed to a fresh core."""
    clients = [main_server.client() for _ in range(4)]
    try:
        texts = [LONG_TEXT, "One.", "Two."]
        futures = [in_thread(lambda c=c, t=t: c.post("/v1/audio/speech", json={"model": "tts1", "input": t}))
                   for c, t in zip(clients, texts, strict=False)]
        main_server.wait_for("tts1", lambda r: r["active_slots"] == 1 and r["queued_requests"] == 2)
        busy = clients[3].post("/v1/audio/speech", json={"model": "tts1", "input": "No.", "busy_timeout_ms": 100})
        assert busy.status_code == 503
        with httpx.Client(base_url=main_server.url, timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/audio/speech", json={"model": "tts1", "input": "Gone."})
        unload = in_thread(lambda: clients[3].post("/v1/models/unload", json={"id": "tts1"}, headers=AUTH))
        main_server.wait_for("tts1", lambda r: r["queued_management"] == 1)
        assert [f.result(timeout=120).status_code for f in futures] == [200, 200, 200]
        assert unload.result(timeout=120).status_code == 200
        with main_server.client() as http:
            assert http.post("/v1/audio/speech", json={"model": "tts1", "input": "Back."}).status_code == 200
    finally:
        for c in clients:
            c.close()
    main_server.wait_idle("tts1")

    records = read_trace(trace_file)
    events = [r.event for r in records]
    assert records[0].event == "config"
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    for needed in ("register", "request", "manage", "begin_unload", "unload_finished", "load_succeeded", "cancel"):
        assert needed in events, needed
    assert any(r.event == "request" and r.decision.startswith("queued") for r in records)
    assert any((r.event == "request" and r.decision.startswith("rejected"))
               or (r.event == "expire" and "expired=[]" not in r.decision) for r in records)

    result = replay(records)
    assert result.divergence is None, str(result.divergence)
    assert result.replayed == sum(1 for r in records if r.event not in PASSIVE_EVENTS)

    # an edited decision is caught: the replay really compares
    idx = next(i for i, r in enumerate(records) if r.event == "request" and r.decision.startswith("granted"))
    forged = [*records[:idx], TraceRecord.from_json(records[idx].to_json().replace('"granted', '"queued')), *records[idx + 1:]]
    assert replay(forged).divergence is not None

    # the command-line front end agrees (on the complete lines written so far)
    copy = trace_file.with_name("replayed.jsonl")
    copy.write_text("".join(r.to_json() + "\n" for r in records))
    done = subprocess.run([sys.executable, "-m", "server.cli", "sim", "replay", str(copy)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    forged_file = trace_file.with_name("forged.jsonl")
    forged_file.write_text("".join(r.to_json() + "\n" for r in forged))
    done = subprocess.run([sys.executable, "-m", "server.cli", "sim", "replay", str(forged_file)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
