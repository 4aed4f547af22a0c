"""SIGTERM on a live server: stop accepting, finish admitted and queued work, exit 0.

The server's session work is held at a gate (:mod:`tests.server.gated`), so the
request in the slot is provably still running, and the one behind it still
queued, when the signal arrives, however fast this machine is.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.server.gated import GatedServer, granted_at, released_at, wait_until
from tests.server.live import DATA, LiveServer, in_thread

SPEECH = "/v1/audio/speech"


def refuses_connections(server: GatedServer) -> bool:
    try:
        httpx.get(server.url + "/health", timeout=10.0)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:
        pass
    return False


def test_sigterm_drains_admitted_and_queued_work(server_logs: Path) -> None:
    server = GatedServer(
        DATA / "drain.json", server_logs
    ).start()  # piper, 1 slot, loaded at startup
    clients = [server.client() for _ in range(2)]
    try:
        assert server.model("piper")["loaded"] is True
        base = server.hold("piper")
        running = in_thread(
            lambda: clients[0].post(SPEECH, json={"model": "piper", "input": "Running now."})
        )
        server.wait_arrived("piper", base + 1)
        queued = in_thread(
            lambda: clients[1].post(
                SPEECH, json={"model": "piper", "input": "Still here.", "seed": 5}
            )
        )
        server.wait_for("piper", lambda r: r["active_slots"] == 1 and r["queued_requests"] == 1)

        server.signal()
        # the listener closes at once: new connections are refused while the old work is held
        wait_until("the listener to close after SIGTERM", lambda: refuses_connections(server))
        assert "shutting down" in server.log()
        assert not running.done() and not queued.done()
        assert [e["label"] for e in server.arrivals("piper", base)] == [
            "Running now."
        ]  # queued: not started

        server.open("piper")
        assert running.result(timeout=120).status_code == 200
        late = queued.result(timeout=120)
        assert late.status_code == 200 and late.content[:4] == b"RIFF"
        assert server.proc is not None
        assert server.proc.wait(60) == 0

        # the server's record: both ran to their end, the queued one after the running one
        log = [e for e in server.events("piper") if e["event"] in ("arrive", "end")]
        assert [(e["event"], e["step"] - base) for e in log] == [
            ("arrive", 1),
            ("end", 1),
            ("arrive", 2),
            ("end", 2),
        ]
        assert [e["label"] for e in server.arrivals("piper", base)] == [
            "Running now.",
            "Still here.",
        ]
        assert all(e["ok"] for e in log if e["event"] == "end")
        # ... and its trace: the second was queued, and got the slot when the first gave it back
        records = server.trace()
        first, second = (int(r.args["ticket"]) for r in records if r.event == "request")
        assert (
            next(r for r in records if r.event == "request" and r.args["ticket"] == second).fields[
                "outcome"
            ]
            == "queued"
        )
        assert granted_at(records, second) == released_at(records, first)
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_a_native_crash_leaves_every_threads_python_stack_in_the_log(server_logs: Path) -> None:
    """A fault in native code (a BLAS, a compiled kernel) kills the process without a Python
    exception: ``voxpool serve`` enables faulthandler, so the log says where each thread was."""
    server = LiveServer(DATA / "lazy_vad.json", server_logs).start()
    try:
        assert httpx.get(server.url + "/health", timeout=10.0).status_code == 200
        server.signal(signal.SIGSEGV)
        assert server.proc is not None and server.proc.wait(60) == -signal.SIGSEGV
        log = server.log()
        assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
        assert "most recent call first" in log and "trio" in log, log[-2000:]
    finally:
        server.stop()
