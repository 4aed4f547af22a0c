"""A real ``voxpool serve`` process on loopback, and small HTTP helpers for the tests.

The server runs as a subprocess (``python -m server.cli serve --parallel-jobs``)
from the repository root, exactly as a user starts it, so these tests exercise
the CLI, the config loader, the listener, the app and the real models together.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "server"
HELLO_WAV = DATA / "audio" / "hello.wav"
TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """One server process; :meth:`stop` sends SIGTERM and returns the exit code."""

    def __init__(
        self, config: Path, log_dir: Path, extra: tuple[str, ...] = (), port: int | None = None
    ) -> None:
        self.config = config
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{config.stem}-{self.port}.log"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> LiveServer:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # One BLAS thread per session: slots already run in parallel threads, and on a small
        # shared machine OpenBLAS's own threads oversubscribe the cores (a wave of 8 requests
        # on 4 slots took 56 s with default threads, 5 s with one).
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.pop("VOXPOOL_MANAGEMENT_TOKEN", None)
        cmd = [
            sys.executable,
            "-m",
            *self.entry(),
            "serve",
            "--parallel-jobs",
            "--config",
            str(self.config),
            "--port",
            str(self.port),
            *self.extra,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become healthy in {timeout}s:\n{self.log()}")

    def entry(self) -> list[str]:
        """The module that runs ``voxpool`` (and its leading arguments): the real CLI."""
        return ["server.cli"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for the drain; kill if it hangs. The exit code (negative if killed)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def client(self, timeout: float = 180.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def model(self, model_id: str) -> dict[str, Any]:
        rows = httpx.get(self.url + "/v1/models", timeout=10.0).json()["data"]
        return next(r for r in rows if r["id"] == model_id)

    def wait_for(
        self, model_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 60.0
    ) -> dict[str, Any]:
        """Poll ``/v1/models`` until ``pred`` holds for the model's row (AssertionError on
        timeout)."""
        deadline = time.monotonic() + timeout
        row = self.model(model_id)
        while not pred(row):
            assert time.monotonic() < deadline, f"timed out waiting on {model_id}: {row}"
            time.sleep(0.02)
            row = self.model(model_id)
        return row

    def wait_idle(self, model_id: str, timeout: float = 90.0) -> dict[str, Any]:
        return self.wait_for(
            model_id,
            lambda r: (
                r["active_slots"] == 0 and r["queued_requests"] == 0 and r["queued_management"] == 0
            ),
            timeout,
        )


def in_thread(fn: Callable[[], Any]) -> Future[Any]:
    """Run ``fn`` in a daemon thread; the future also records its completion time."""
    fut: Future[Any] = Future()

    def body() -> None:
        try:
            result = fn()
        except BaseException as exc:
            fut.done_at = time.monotonic()  # type: ignore[attr-defined]
            fut.set_exception(exc)
        else:
            fut.done_at = time.monotonic()  # type: ignore[attr-defined]
            fut.set_result(result)

    threading.Thread(target=body, daemon=True).start()
    return fut


def sse_events(lines: Iterator[str]) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def parse_sse(text: str) -> list[Any]:
    assert text.endswith("\n\n"), text[-200:]
    return sse_events(iter(text.split("\n")))


def assert_error(
    resp: httpx.Response, status: int, error_type: str, contains: str = ""
) -> dict[str, Any]:
    """The OpenAI error shape: ``{"error": {"message", "type"}}`` with the expected status/type."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"] == error_type, body
    assert contains in body["error"]["message"], body
    return dict(body["error"])


def silence_wav(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


LONG_TEXT = (
    "The quick brown fox jumps over the lazy dog near the river bank today. "
    "Seven silver swans swam silently across the cold and quiet lake. "
    "A long sentence keeps one slot busy for a while."
)
"""Three sentences: long enough to hold a slot while a test looks at the counters."""


def closed_by_server(s: socket.socket) -> str:
    """Wait until the server ends the connection: 'eof' or 'reset' (data before it is discarded)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return "reset"
    return "eof"
