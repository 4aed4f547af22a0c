"""server.ray.ingress without a cluster: which model a request names, and the retry rules.

The model deployment's handle is replaced by a scripted one (each call's parts,
or the exception the call raises); the live cluster tests are test_ray_serve.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")

from server.config import embedded_default
from server.http.errors import error_response
from server.ray.exchange import Forwarded, Start
from server.ray.ingress import IngressApp, is_busy, model_of

CONFIG = embedded_default()
OK = [Start(200, ((b"content-type", b"audio/wav"),)), b"RIFF", b"data"]


def busy_parts(message: str = "every slot is busy", replica: str = "r1") -> list[Any]:
    response = error_response(503, message, "server_busy", retry_after=2)
    headers = tuple((bytes(k), bytes(v)) for k, v in response.raw_headers)
    return [Start(503, headers, replica), bytes(response.body)]


class Lost(Exception):
    """Stands for Ray's ActorDiedError / ActorUnavailableError."""


class Call:
    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.cancelled = False

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> Any:
        if not self.parts:
            raise StopAsyncIteration
        part = self.parts.pop(0)
        if isinstance(part, Exception):
            raise part
        return part

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedHandle:
    """Each ``handle.remote`` call plays the next script entry."""

    def __init__(self, *script: list[Any]) -> None:
        self.script = list(script)
        self.options_seen: list[dict[str, Any]] = []
        self.requests: list[Forwarded] = []
        self.calls = 0

    def options(self, **options: Any) -> ScriptedHandle:
        self.options_seen.append(options)
        return self

    @property
    def handle(self) -> ScriptedHandle:
        return self

    def remote(self, request: Forwarded) -> Call:
        self.calls += 1
        self.requests.append(request)
        return Call(list(self.script.pop(0)))


def post(handle: ScriptedHandle, **kwargs: Any) -> httpx.Response:
    app = IngressApp(handle, CONFIG, "test", retries=2)

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.post("/v1/audio/speech", **kwargs)

    return asyncio.run(main())


SPEECH = {"json": {"model": "piper", "input": "hi"}}


def test_a_plain_answer_passes_through_with_the_model_as_the_multiplexed_id() -> None:
    handle = ScriptedHandle(OK)
    r = post(handle, **SPEECH)
    assert (r.status_code, r.content) == (200, b"RIFFdata")
    assert r.headers["content-type"] == "audio/wav" and r.headers["x-voxpool-attempts"] == "1"
    assert handle.options_seen == [{"stream": True, "multiplexed_model_id": "piper"}]


def test_a_busy_replica_is_retried_avoiding_it_and_the_client_sees_the_success() -> None:
    handle = ScriptedHandle(busy_parts(replica="r1"), busy_parts(replica="r2"), OK)
    r = post(handle, **SPEECH)
    assert (r.status_code, handle.calls) == (200, 3)
    assert r.headers["x-voxpool-attempts"] == "3"
    assert handle.options_seen == [{"stream": True, "multiplexed_model_id": "piper"}]
    assert [req.avoid for req in handle.requests] == [(), ("r1",), ("r1", "r2")]


def test_when_every_try_is_busy_the_client_gets_the_last_503_with_retry_after() -> None:
    handle = ScriptedHandle(busy_parts("a"), busy_parts("b"), busy_parts("c"))
    r = post(handle, **SPEECH)
    assert (r.status_code, handle.calls) == (503, 3)
    assert r.json()["error"] == {"message": "c", "type": "server_busy"}
    assert r.headers["retry-after"] == "2" and r.headers["x-voxpool-attempts"] == "3"


def test_a_503_that_is_not_busy_is_not_retried() -> None:
    response = error_response(503, "draining", "shutting_down")
    parts = [Start(503, tuple(response.raw_headers)), bytes(response.body)]
    handle = ScriptedHandle(parts, OK)
    r = post(handle, **SPEECH)
    assert (r.status_code, handle.calls) == (503, 1)
    assert r.json()["error"]["type"] == "shutting_down" and r.headers["x-voxpool-attempts"] == "1"


def test_a_replica_lost_before_answering_is_retried() -> None:
    handle = ScriptedHandle([Lost("actor died")], OK)
    r = post(handle, **SPEECH)
    assert (r.status_code, handle.calls) == (200, 2)
    assert handle.requests[1].avoid == ()  # Ray drops a dead replica from routing itself


def test_when_every_replica_is_lost_the_client_gets_a_clean_503() -> None:
    handle = ScriptedHandle([Lost("1")], [Lost("2")], [Lost("3")])
    r = post(handle, **SPEECH)
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "server_busy"
    assert "lost (Lost)" in r.json()["error"]["message"]


def test_a_replica_lost_mid_response_ends_the_response_without_a_retry() -> None:
    handle = ScriptedHandle([OK[0], b"RIFF", Lost("gone")], OK)
    with pytest.raises(Lost):
        post(handle, **SPEECH)
    assert handle.calls == 1


def test_the_body_limit_applies_at_the_ingress() -> None:
    handle = ScriptedHandle(OK)
    big = b"x" * (CONFIG.max_request_body_bytes + 1)
    r = post(handle, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and handle.calls == 0


def forwarded(body: bytes, content_type: bytes, path: str = "/v1/audio/transcriptions") -> Any:
    headers = ((b"content-type", content_type),) if content_type else ()
    return Forwarded("POST", path, b"", headers, body)


@pytest.mark.parametrize(
    ("request_", "model"),
    [
        (forwarded(json.dumps({"model": "whisper"}).encode(), b"application/json"), "whisper"),
        (forwarded(b'{"model": 3}', b"application/json"), None),
        (forwarded(b"not json", b"application/json"), None),
        (forwarded(b"model=silero_vad&x=1", b"application/x-www-form-urlencoded"), "silero_vad"),
        (
            forwarded(
                b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
                b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                b"Content-Type: audio/wav\r\n\r\nRIFF\r\n--B--\r\n",
                b"multipart/form-data; boundary=B",
            ),
            "whisper",
        ),
        (forwarded(b"--B\r\ngarbage", b"multipart/form-data; boundary=B"), None),
        (forwarded(b'{"id": "piper"}', b"application/json", "/v1/models/unload"), "piper"),
        (Forwarded("GET", "/v1/audio/voices", b"model=piper", (), b""), "piper"),
    ],
)
def test_the_model_a_request_names(request_: Forwarded, model: str | None) -> None:
    assert asyncio.run(model_of(request_)) == model


def test_a_malformed_model_id_is_forwarded_without_a_multiplexed_id() -> None:
    handle = ScriptedHandle(OK, OK)
    post(handle, json={"model": "no pe!", "input": "hi"})
    post(handle, json={"model": "registered.at:run-time", "input": "hi"})  # not in the config
    assert [o["multiplexed_model_id"] for o in handle.options_seen] == [
        "",
        "registered.at:run-time",
    ]


def test_is_busy_reads_the_error_type() -> None:
    assert is_busy(Start(503, ()), b'{"error": {"type": "server_busy"}}')
    assert not is_busy(Start(503, ()), b"oops")
    assert not is_busy(Start(500, ()), b'{"error": {"type": "server_busy"}}')
