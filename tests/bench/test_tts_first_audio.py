"""Smoke test of the TTS time-to-first-audio bench (bench/tts_first_audio.py), issue #15.

Two short sentences through each way the bench times (a streaming Piper session,
a real ``voxpool serve`` streaming raw PCM, piper-tts), one repetition: the
structure of its rows, the first audio before the last, and the streamed audio
equal to the non-streamed synthesis where the project guarantees it (a stream's
chunks concatenate to ``run``'s audio; the server at one BLAS thread gives the
same bytes as the session at one). Timing figures are not asserted (shared machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench.bench_module import bench_module

TWO = "Hello there. How are you?"


bench = bench_module("tts_first_audio")


@pytest.fixture(scope="module")
def session() -> Any:
    return bench.streaming_session()


@pytest.fixture(scope="module")
def voice() -> Any:
    return bench.peer_voice(1)


def _run_pcm(session: Any, text: str) -> bytes:
    from backends.piper import PiperRequest, pcm16_bytes
    from bench.common import blas_threads

    with blas_threads(1):
        return bytes(pcm16_bytes(session.run(PiperRequest(text, noise_w=0.0, seed=0)).audio))


def _check(t: Any, chunks: int | None) -> None:
    assert 0 < t.first_s <= t.all_s
    if chunks is not None:
        assert t.chunks == chunks
    assert t.audio_s == pytest.approx(len(t.pcm) / 2 / 22050)


def test_the_session_stream_is_one_chunk_per_sentence_and_equals_run(session: Any) -> None:
    t = bench._limited(session, 1)(TWO)
    _check(t, 2)
    assert t.first_s < t.all_s
    assert 0 < t.first_audio_s < t.audio_s
    assert t.pcm == _run_pcm(session, TWO)


def test_the_peer_streams_the_same_sentences_and_frames(session: Any, voice: Any) -> None:
    ours = bench._limited(session, 1)(TWO)
    peer = bench.peer_stream(voice, TWO)
    _check(peer, 2)
    assert peer.first_s < peer.all_s
    # noise_w = 0: the same durations, so the same number of samples per sentence
    assert len(peer.pcm) == len(ours.pcm)
    assert peer.first_audio_s == pytest.approx(ours.first_audio_s)


def test_the_served_stream_gives_the_session_bytes(session: Any, tmp_path: Path) -> None:
    with bench.served(1, tmp_path) as client:
        t = bench.http_stream(client, TWO, 22050)
    _check(t, None)
    assert t.pcm == _run_pcm(session, TWO)


def test_measure_rotates_and_rows_have_ratios(session: Any, voice: Any) -> None:
    order: list[str] = []

    def recorded(name: str, fn: Any) -> Any:
        def run(text: str) -> Any:
            order.append(name)
            return fn(text)

        return run

    runs = {
        "voxpool in-process": recorded("ours", bench._limited(session, 1)),
        bench.PEER: recorded("peer", lambda text: bench.peer_stream(voice, text)),
    }
    results = bench.measure(runs, {"two": TWO}, repeats=2)
    assert order == ["ours", "peer", "ours", "peer", "peer", "ours"]  # warm-up, then rotated
    assert {k: len(v) for k, v in results.items()} == {
        ("two", "voxpool in-process"): 2,
        ("two", bench.PEER): 2,
    }
    rows = bench.rows_of(results, threads=1)
    assert [r["impl"] for r in rows] == ["voxpool in-process", bench.PEER]
    ours, peer = rows
    assert ours["threads"] == 1 and str(ours["input"]).startswith("two, ")
    assert float(str(ours["first_ms"])) <= float(str(ours["all_ms"]))
    assert float(str(ours["first/peer"])) > 0 and float(str(ours["all/peer"])) > 0
    assert peer["first/peer"] == "" and peer["all/peer"] == ""
    table = bench.markdown_table(rows).splitlines()
    assert len(table) == 4 and table[0].startswith("| threads | input | impl | first_ms |")


def test_cold_runs_fresh_processes() -> None:
    rows = bench.cold(repeats=1, threads=1)
    assert [r["impl"] for r in rows] == ["voxpool in-process", bench.PEER]
    for r in rows:
        assert float(str(r["first request: first_ms"])) <= float(str(r["first request: all_ms"]))
        assert float(str(r["load_ms"])) > 0
    assert float(str(rows[0]["first request: first/peer"])) > 0
