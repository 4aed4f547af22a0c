"""One live server for the reliability suite: every route, tight limits, management on.

The process runs with glibc's mmap threshold pinned at its default (128 KiB;
glibc otherwise raises it after large frees), so freed request buffers go
back to the kernel and each memory case is measured from a clean baseline
(docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.cases import CONFIG, Limits
from tests.server.live import LiveServer


@pytest.fixture(scope="session")
def limits() -> Limits:
    return Limits.from_config(CONFIG)


@pytest.fixture(scope="session")
def reliability_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(CONFIG, tmp_path_factory.mktemp("reliability-logs"))
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"  # LiveServer passes the environment on
    try:
        server.start()
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"reliability server exited with {rc}:\n{server.log()[-4000:]}"


@pytest.fixture(scope="session")
def rel(reliability_server: LiveServer) -> Iterator[httpx.Client]:
    """One client for the session (a client per test costs about 0.2 s to set up)."""
    with reliability_server.client(timeout=120.0) as client:
        yield client


@pytest.fixture(scope="session")
def server_log(reliability_server: LiveServer) -> Path:
    return reliability_server.log_path
