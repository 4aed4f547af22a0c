"""The malformed-input corpus against one live server: every case a 4xx JSON error, never a 500,
and the server healthy afterwards (docs/reliability.md has the figures)."""

from __future__ import annotations

import collections

import httpx
import pytest

from tests.reliability.cases import CONFIG, Limits, assert_healthy, error_of
from tests.reliability.corpus import Case, corpus
from tests.server.live import AUTH, HELLO_WAV, LiveServer

CASES = corpus(HELLO_WAV.read_bytes(), Limits.from_config(CONFIG))


def test_the_corpus_is_large_and_covers_every_route() -> None:
    assert len(CASES) >= 300
    routes = collections.Counter(c.path for c in CASES)
    for path in (
        "/health",
        "/v1/models",
        "/metrics",
        "/openapi.json",
        "/v1/audio/voices",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/vad",
        "/v1/tasks/run",
        "/v1/tasks/batch",
        "/v1/tasks/stream",
        "/v1/models/load",
        "/v1/models/unload",
        "/v1/tasks/unload_models",
        "/v1/tasks/unload_all_models",
    ):
        assert routes[path] > 0, path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name[:120])
def test_malformed_request_gets_its_4xx(rel: httpx.Client, case: Case) -> None:
    resp = rel.request(case.method, case.path, **case.request)
    assert resp.status_code == case.status, (case.name, resp.status_code, resp.text[:400])
    error = error_of(resp)
    assert "request_id" not in error
    assert case.contains in error["message"], (case.name, error)
    if case.status == 405:
        assert resp.headers.get("allow"), resp.headers


def test_server_is_healthy_after_the_corpus(
    reliability_server: LiveServer, rel: httpx.Client
) -> None:
    assert_healthy(reliability_server, rel, HELLO_WAV.read_bytes())
    assert "failed: internal error" not in reliability_server.log(), "a request was answered 500"


def test_model_paths_are_shown_only_to_management_clients(rel: httpx.Client) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        rows = rel.get("/v1/models", headers=headers).json()["data"]
        assert rows and all("path" not in row for row in rows)
    rows = rel.get("/v1/models", headers=AUTH).json()["data"]
    assert rows and all("path" in row for row in rows)


def test_405_allow_names_the_route_method(rel: httpx.Client) -> None:
    assert rel.get("/v1/audio/speech").headers["allow"] == "POST"
    assert set(rel.post("/health").headers["allow"].split(", ")) == {"GET", "HEAD"}
