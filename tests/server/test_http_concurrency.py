"""Parallel slots on a live server: parity under load, management barriers, disconnects.

The server is ``voxpool serve`` with the real models, its session work held at a
gate (:mod:`tests.server.gated`): a request stays in its slot until the test
lets it go, so no check depends on how long a synthesis takes on this machine.
Orders are read from the server's own records: its ``--trace`` (who was granted
a slot when) and the gated provider's log (what ran, in which order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.gated import (
    GatedServer,
    granted_at,
    max_in_flight,
    raw_post,
    released_at,
    serving,
    wait_until,
)
from tests.server.live import AUTH, DATA, in_thread

WORDS = [
    f"Number {w} is here." for w in ("one", "two", "three", "four", "five", "six", "seven", "eight")
]
SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def gated(server_logs: Path) -> Iterator[GatedServer]:
    """main.json (piper 4 slots, tts1 1 slot, management on), traced, every model's work gated."""
    with serving(DATA / "main.json", server_logs) as server:
        yield server


def clients(server: GatedServer, stack: ExitStack, n: int) -> list[httpx.Client]:
    return [stack.enter_context(server.client()) for _ in range(n)]


def idle(row: dict[str, Any]) -> bool:
    return all(row[k] == 0 for k in ("active_slots", "queued_requests", "queued_management"))


def test_eight_concurrent_requests_on_four_slots_match_serial(gated: GatedServer) -> None:
    """Same seeded requests, serially and 8 at once on 4 slots: byte-identical audio. The 8 are
    held in their sessions until 4 run and 4 wait, so the slots are seen full and the queue used."""
    requests = [{"model": "piper", "input": w, "seed": 100 + i} for i, w in enumerate(WORDS)]
    with gated.client() as http:
        serial = []
        for body in requests:
            r = http.post(SPEECH, json=body)
            assert r.status_code == 200, r.text
            serial.append(r.content)
    assert len(set(serial)) == len(serial)

    with ExitStack() as stack:
        base = stack.enter_context(gated.held("piper"))
        since = gated.mark()
        cs = clients(gated, stack, len(requests))
        futures = [
            in_thread(partial(c.post, SPEECH, json=b)) for c, b in zip(cs, requests, strict=True)
        ]
        row = gated.wait_for(
            "piper", lambda r: r["active_slots"] == 4 and r["queued_requests"] == 4
        )
        assert row["slots"] == 4 and len(gated.arrivals("piper", base)) == 4
        assert not any(f.done() for f in futures)
        gated.open("piper")
        wave = [f.result(timeout=120) for f in futures]
    assert [r.status_code for r in wave] == [200] * 8
    assert [r.content for r in wave] == serial
    log = gated.events("piper", since)
    assert max_in_flight(log) == 4  # never more sessions at work than slots
    assert sum(e["event"] == "end" and e["ok"] for e in log) == 8
    assert idle(gated.wait_idle("piper"))


def test_unload_waits_for_older_requests_and_blocks_newer_ones(gated: GatedServer) -> None:
    """A, B run on piper (4 slots); an unload queues behind them; C, sent after it, waits
    for the unload although two slots are free, then reloads the model."""
    gated.wait_idle("piper")
    trace_from = len(gated.trace())
    since = gated.mark()
    texts = {
        "a": "Alpha runs first.",
        "b": "Bravo runs second.",
        "c": "Charlie comes after the unload.",
    }
    with ExitStack() as stack:
        base = stack.enter_context(gated.held("piper"))
        a_client, b_client, u_client, c_client = clients(gated, stack, 4)
        a = in_thread(lambda: a_client.post(SPEECH, json={"model": "piper", "input": texts["a"]}))
        gated.wait_arrived("piper", base + 1)
        b = in_thread(
            lambda: b_client.post(SPEECH, json={"model": "piper", "input": texts["b"], "seed": 2})
        )
        gated.wait_arrived("piper", base + 2)
        u = in_thread(
            lambda: u_client.post("/v1/models/unload", json={"id": "piper"}, headers=AUTH)
        )
        gated.wait_for("piper", lambda r: r["queued_management"] == 1)
        c = in_thread(lambda: c_client.post(SPEECH, json={"model": "piper", "input": texts["c"]}))
        row = gated.wait_for("piper", lambda r: r["queued_requests"] == 1)
        # C queued although two of the four slots are free: it is behind the unload
        assert row["active_slots"] == 2 and row["queued_management"] == 1 and row["slots"] == 4
        assert not any(f.done() for f in (a, b, u, c))  # A and B are held; U and C wait for them
        gated.open("piper")
        results = {
            name: f.result(timeout=120) for name, f in (("a", a), ("b", b), ("u", u), ("c", c))
        }
    assert {k: r.status_code for k, r in results.items()} == {
        "a": 200,
        "b": 200,
        "u": 200,
        "c": 200,
    }
    assert results["u"].json() == {"id": "piper", "loaded": False}
    assert gated.wait_idle("piper")["loaded"] is True  # C loaded it again

    # the server's trace: who got a slot when
    records = [r for r in gated.trace()[trace_from:] if r.model == "piper"]
    requests = [r for r in records if r.event == "request"]
    managers = [r for r in records if r.event == "manage"]
    assert len(requests) == 3 and len(managers) == 1
    ta, tb, tc = (int(r.args["ticket"]) for r in requests)
    tu = int(managers[0].args["ticket"])
    assert [r.fields["outcome"] for r in requests] == [
        "granted",
        "granted",
        "queued",
    ]  # C: two slots free
    assert managers[0].fields["outcome"] == "queued"
    # U got its turn only when A and B had both given their slots back (granted in the
    # later release); the model was torn down under it; C got a slot only after that
    unloaded = [r.seq for r in records if r.event in ("begin_unload", "unload_finished")]
    assert len(unloaded) == 2
    assert max(released_at(records, ta), released_at(records, tb)) <= granted_at(records, tu)
    assert granted_at(records, tu) < unloaded[0] < unloaded[1] <= granted_at(records, tc)
    assert released_at(records, tu) <= granted_at(records, tc)

    # the provider's log: A and B ended, the weights went, came back, then C ran
    log = gated.events("piper", since)
    seq = {
        name: next(e["seq"] for e in log if e["event"] == "arrive" and e["label"] == text)
        for name, text in texts.items()
    }
    steps = {e["label"]: e["step"] for e in log if e["event"] == "arrive"}
    ends = {e["step"]: e["seq"] for e in log if e["event"] == "end"}
    freed = next(e["seq"] for e in log if e["event"] == "release")
    loaded = next(e["seq"] for e in log if e["event"] == "load" and e["seq"] > freed)
    assert max(ends[steps[texts["a"]]], ends[steps[texts["b"]]]) < freed < loaded < seq["c"]


def test_client_disconnect_while_queued_frees_its_place(gated: GatedServer) -> None:
    """tts1 has one slot, held; a client queued behind it goes away: its place is freed at once,
    it is counted as 499, and it never reaches a session."""
    gone = 'voxpool_request_seconds_count{model="tts1",route="/v1/audio/speech",status="499"}'

    def count_gone(http: httpx.Client) -> float:
        line = next(
            (ln for ln in http.get("/metrics").text.splitlines() if ln.startswith(gone + " ")), None
        )
        return float(line.split()[-1]) if line else 0.0

    gated.wait_idle("tts1")
    with ExitStack() as stack:
        base = stack.enter_context(gated.held("tts1"))
        http, other = clients(gated, stack, 2)
        before = count_gone(http)
        holder = in_thread(
            lambda: other.post(SPEECH, json={"model": "tts1", "input": "Holder of the slot."})
        )
        gated.wait_arrived("tts1", base + 1)
        impatient = raw_post(gated, SPEECH, {"model": "tts1", "input": "Never mind."})
        gated.wait_for("tts1", lambda r: r["queued_requests"] == 1)
        impatient.close()
        # the waiter leaves the queue when its client goes, while the slot is still held
        row = gated.wait_for("tts1", lambda r: r["queued_requests"] == 0)
        assert row["active_slots"] == 1 and not holder.done()
        # counted as "client closed", not as a server error
        wait_until("the 499 to be counted", lambda: count_gone(http) == before + 1)
        gated.open("tts1")
        assert holder.result(timeout=120).status_code == 200
        gated.wait_idle("tts1")
        r = http.post(SPEECH, json={"model": "tts1", "input": "Hi.", "busy_timeout_ms": 1000})
        assert r.status_code == 200
    labels = [e["label"] for e in gated.arrivals("tts1", base)]
    assert labels == ["Holder of the slot.", "Hi."]  # the request that left never ran


def test_client_disconnect_while_streaming_frees_the_slot(gated: GatedServer) -> None:
    """Thirty sentences, one chunk each, each held until the test lets it go: a client that
    leaves after the first chunk frees the slot at a chunk boundary (the stream is closed
    without running to its end), and the next request runs."""
    text = " ".join(["Then another sentence follows."] * 30)
    gated.wait_idle("tts1")
    with ExitStack() as stack:
        base = stack.enter_context(gated.held("tts1"))
        http = stack.enter_context(gated.client())
        gated.release("tts1", base + 1)  # the first chunk only
        with http.stream(
            "POST", SPEECH, json={"model": "tts1", "input": text, "stream": True}
        ) as s:
            assert s.status_code == 200
            first = next(s.iter_lines())
            assert first.startswith("data: ") and "speech.audio.delta" in first
            gated.wait_arrived("tts1", base + 2)  # the server asks for the second chunk: held
            assert gated.model("tts1")["active_slots"] == 1

        # the client is gone: let each chunk the server still asks for go, one at a time,
        # until the slot is free (a server that kept streaming would exhaust the text)
        def freed_or_asked(through: int) -> str | None:
            if idle(gated.model("tts1")):
                return "freed"
            return "asked" if gated.last_step("tts1") > through else None

        through = base + 1
        while (
            wait_until(
                "the slot freed or one more chunk asked for", partial(freed_or_asked, through)
            )
            == "asked"
        ):
            through = gated.last_step("tts1")
            gated.release("tts1", through)
        call = gated.arrivals("tts1", base)[0]["call"]
        closed = next(
            e for e in gated.events("tts1") if e["event"] == "stream_closed" and e["call"] == call
        )
        assert closed["exhausted"] is False and closed["chunks"] < 30, closed
        gated.open("tts1")
        r = http.post(SPEECH, json={"model": "tts1", "input": "Hi.", "busy_timeout_ms": 1000})
        assert r.status_code == 200
