"""Session-scoped live servers: one process per configuration, always terminated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.live import DATA, HELLO_WAV, LiveServer


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace") / "server-trace.jsonl"


@pytest.fixture(scope="session")
def main_server(server_logs: Path, trace_file: Path) -> Iterator[LiveServer]:
    """piper (4 slots, streaming), whisper, silero_vad (2 slots), tts1 (piper, 1 slot);
    management on with a bearer token; audio_roots = tests/data/server/audio; traced."""
    server = LiveServer(DATA / "main.json", server_logs, extra=("--trace", str(trace_file))).start()
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"main server exited with {rc}:\n{server.log()[-4000:]}"


@pytest.fixture(scope="session")
def restricted_server(server_logs: Path) -> Iterator[LiveServer]:
    """Management off, no audio_roots, a 4 KiB body limit."""
    server = LiveServer(DATA / "restricted.json", server_logs).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()[-4000:]


@pytest.fixture()
def http(main_server: LiveServer) -> Iterator[httpx.Client]:
    with main_server.client() as client:
        yield client


@pytest.fixture(scope="session")
def hello_wav() -> bytes:
    """0.82 s of "Hello world." spoken by piper, 16 kHz mono 16-bit."""
    return HELLO_WAV.read_bytes()
