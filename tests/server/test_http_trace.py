"""``--trace FILE`` on a live server, replayed: a fresh core makes the same decisions."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from core.events import TraceRecord
from core.replay import PASSIVE_EVENTS, replay
from tests.server.gated import GatedServer, raw_post, serving
from tests.server.live import AUTH, DATA, ROOT, LiveServer, in_thread

SPEECH = "/v1/audio/speech"


def read_trace(path: Path) -> list[TraceRecord]:
    text = path.read_text()
    lines = text.split("\n")[:-1]  # only complete lines: the server is still writing
    return [TraceRecord.from_json(line) for line in lines]


@pytest.fixture(scope="module")
def gated(server_logs: Path) -> Iterator[GatedServer]:
    """main.json with every model's session work held at a gate the test opens."""
    with serving(DATA / "main.json", server_logs) as server:
        yield server


def assert_replays(records: list[TraceRecord]) -> None:
    """A fresh core fed ``records`` makes every recorded decision again."""
    assert records[0].event == "config"
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    result = replay(records)
    assert result.divergence is None, str(result.divergence)
    assert result.replayed == sum(1 for r in records if r.event not in PASSIVE_EVENTS)


def test_live_trace_replays_identically(
    gated: GatedServer, main_server: LiveServer, trace_file: Path
) -> None:
    """Queued requests on a one-slot model held by a gate, a 503, a client gone while queued,
    an unload behind them, a reload: that trace is re-fed to a fresh core; so is the main
    server's whole session (every test so far on it)."""
    gated.wait_idle("tts1")
    with ExitStack() as stack:
        base = stack.enter_context(gated.held("tts1"))
        clients = [stack.enter_context(gated.client()) for _ in range(4)]

        def send(k: int, text: str) -> Future[Any]:
            return in_thread(
                partial(clients[k].post, SPEECH, json={"model": "tts1", "input": text})
            )

        futures = [send(0, "Held first.")]
        gated.wait_arrived("tts1", base + 1)
        futures += [send(1, "One."), send(2, "Two.")]
        gated.wait_for("tts1", lambda r: r["active_slots"] == 1 and r["queued_requests"] == 2)
        busy = clients[3].post(
            SPEECH, json={"model": "tts1", "input": "No.", "busy_timeout_ms": 100}
        )
        assert busy.status_code == 503
        gone = raw_post(gated, SPEECH, {"model": "tts1", "input": "Gone."})
        gated.wait_for("tts1", lambda r: r["queued_requests"] == 3)
        gone.close()
        gated.wait_for("tts1", lambda r: r["queued_requests"] == 2)
        unload = in_thread(
            lambda: clients[3].post("/v1/models/unload", json={"id": "tts1"}, headers=AUTH)
        )
        gated.wait_for("tts1", lambda r: r["queued_management"] == 1)
        gated.open("tts1")
        assert [f.result(timeout=120).status_code for f in futures] == [200, 200, 200]
        assert unload.result(timeout=120).status_code == 200
        assert clients[0].post(SPEECH, json={"model": "tts1", "input": "Back."}).status_code == 200
    gated.wait_idle("tts1")

    records = gated.trace()
    events = [r.event for r in records]
    for needed in (
        "register",
        "request",
        "manage",
        "begin_unload",
        "unload_finished",
        "load_succeeded",
        "cancel",
    ):
        assert needed in events, needed
    assert any(r.event == "request" and r.fields["outcome"] == "queued" for r in records)
    assert any(
        (r.event == "request" and r.fields["outcome"] == "rejected")
        or (r.event == "expire" and r.fields["expired"])
        for r in records
    )
    assert_replays(records)
    assert_replays(read_trace(trace_file))

    # an edited decision is caught: the replay really compares
    idx = next(
        i
        for i, r in enumerate(records)
        if r.event == "request" and r.fields["outcome"] == "granted"
    )
    forged = [
        *records[:idx],
        TraceRecord.from_json(records[idx].to_json().replace('"granted', '"queued')),
        *records[idx + 1 :],
    ]
    assert replay(forged).divergence is not None

    # the command-line front end agrees (on the complete lines written so far)
    copy = gated.gate_dir / "replayed.jsonl"
    copy.write_text("".join(r.to_json() + "\n" for r in records))
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "sim", "replay", str(copy)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    forged_file = gated.gate_dir / "forged.jsonl"
    forged_file.write_text("".join(r.to_json() + "\n" for r in forged))
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "sim", "replay", str(forged_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
