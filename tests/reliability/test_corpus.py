"""The malformed-input corpus against one live server: every case a 4xx JSON error, never a 500,
and the server healthy afterwards (docs/reliability.md has the figures)."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from server.config import load_config
from server.serving import make_app
from tests.reliability.cases import CONFIG, Limits, assert_healthy, error_of
from tests.reliability.corpus import ROUTES, Case, corpus
from tests.server.live import AUTH, HELLO_WAV, LiveServer

CASES = corpus(HELLO_WAV.read_bytes(), Limits.from_config(CONFIG))


def served_routes() -> dict[str, frozenset[str]]:
    """Every path the server's app routes, with its methods (HEAD aside), read from the Starlette
    app under the middleware that :func:`server.serving.make_app` wraps it in (built in an event
    loop, as the runtime's clock needs one; the app never starts, so nothing loads)."""

    async def build() -> Any:
        return make_app(load_config(CONFIG))

    app = anyio.run(build)
    while not isinstance(app, Starlette):
        app = app.app  # Observe, BodyLimit, CancelOnDisconnect: each wraps the next as ``app``
    return {
        route.path: frozenset(route.methods or ()) - {"HEAD"}
        for route in app.routes
        if isinstance(route, Route)
    }


def routes_without_cases(served: Iterable[str], cases: Iterable[Case]) -> list[str]:
    """The served paths that no corpus case requests."""
    covered = collections.Counter(c.path for c in cases)
    return sorted(path for path in served if not covered[path])


def test_the_corpus_is_large_and_covers_every_route() -> None:
    assert len(CASES) >= 300
    served = served_routes()
    assert "/v1/audio/speech" in served and "/" in served, served
    missing = routes_without_cases(served, CASES)
    assert not missing, f"routes the app serves without corpus cases: {missing}"
    wrong = {
        path: sorted(methods)
        for path, methods in served.items()
        if frozenset({ROUTES.get(path, "")}) != methods
    }
    assert not wrong, (
        f"tests/reliability/corpus.py ROUTES must name each route's one method (its 405 cases "
        f"come from it); the app serves: {wrong}"
    )


def test_a_new_route_without_cases_is_named() -> None:
    served = {**served_routes(), "/v1/audio/new_thing": frozenset({"POST"})}
    assert routes_without_cases(served, CASES) == ["/v1/audio/new_thing"]


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
