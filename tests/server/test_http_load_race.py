"""Race report 2 on a live server: a client leaves while the first load it waits for fails.

The gated provider (:mod:`tests.server.gated`) holds the weights load of
``silero_vad`` and makes it fail. Client A starts the first load, client B
waits for it; then B's connection is closed and the failing load is let go at
once (or the other way round), so the disconnect and the failure reach the
server together. Whatever order the event loop handles them in (B gone before
the failure names it the next initializer, or after), nobody may be left
holding the initializer role:
a later request loads the model and is served, the counters drain, and the
trace shows what happened. Repeated a few times, each after an unload. The
exact interleaving of the report (the cancellation delivered, the failure
handled before the waiter's clean-up) is reached deterministically by the
simulator and by tests/runtime/test_plain_trio_races.py.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.server.gated import GatedServer, serving, wait_until
from tests.server.live import AUTH, DATA, HELLO_WAV, in_thread

MODEL = "silero_vad"
ATTEMPTS = 4


def loads_started(server: GatedServer) -> int:
    return sum(1 for e in server.events(MODEL) if e["event"] == "load_arrive")


def raw_vad_request(server: GatedServer) -> socket.socket:
    """B: a complete VAD request on a raw socket, so the test can drop the connection at will."""
    body = json.dumps({"model": MODEL, "audio_path": str(DATA / "audio" / "hello.wav")}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST /v1/audio/vad HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def test_client_leaving_as_the_first_load_fails_leaves_the_model_serving(server_logs: Path) -> None:
    with serving(DATA / "lazy_vad.json", server_logs) as server:
        gate = server.gate_dir
        files = {"file": ("hello.wav", HELLO_WAV.read_bytes(), "audio/wav")}
        with server.client() as a_http, server.client() as c_http:
            for attempt in range(ATTEMPTS):
                (gate / f"hold-load-{MODEL}").touch()
                (gate / f"fail-load-{MODEL}").touch()
                loads_before = loads_started(server)
                a = in_thread(
                    lambda: a_http.post("/v1/audio/vad", files=files, data={"model": MODEL})
                )
                wait_until("A's load to start", lambda n=loads_before: loads_started(server) > n)
                b = raw_vad_request(server)
                server.wait_for(MODEL, lambda r: r["active_slots"] == 2 and r["state"] == "loading")
                if attempt % 2 == 0:  # B leaves just before the load fails, or just after
                    b.close()
                    (gate / f"hold-load-{MODEL}").unlink()
                else:
                    (gate / f"hold-load-{MODEL}").unlink()
                    b.close()
                failed = a.result(timeout=120)
                assert failed.status_code >= 500 and "error" in failed.json(), failed.text
                assert "load" in failed.json()["error"]["message"]

                served = c_http.post("/v1/audio/vad", files=files, data={"model": MODEL})
                assert served.status_code == 200, f"attempt {attempt}: {served.text}"
                assert len(served.json()["segments"]) == 1
                row = server.wait_for(
                    MODEL, lambda r: r["active_slots"] == 0 and r["queued_requests"] == 0
                )
                assert row["state"] == "ready" and row["loaded"] is True
                unloaded = c_http.post("/v1/models/unload", json={"id": MODEL}, headers=AUTH)
                assert unloaded.status_code == 200, unloaded.text
        left = [r for r in server.trace() if r.event == "abandon_wait"]
        assert left, "B never reached the wait for A's load"
        assert all(r.fields["left"] in ("waiter", "initializer", "nothing") for r in left)
