"""16 Piper sessions hold one copy of the weights; each adds only its small private state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from backends.piper import PiperRequest, load_factory
from backends.piper.session import PiperSession
from tests.models.memory import held_and_grown

SESSIONS = 16


pytestmark = pytest.mark.usefixtures("one_blas_thread")


def test_sixteen_sessions_share_one_copy_of_the_weights() -> None:
    factory = load_factory(mode="streaming")
    primary = factory.create()
    request = PiperRequest("Yes.", seed=1)
    primary.run(request)  # warm-up: lazy imports, espeak-ng, allocator pools

    def open_streams() -> tuple[list[PiperSession], list[Iterator[Any]]]:
        clones = [factory.clone(primary) for _ in range(SESSIONS - 1)]
        streams = [iter(session.stream(request)) for session in clones]
        for stream in streams:  # each clone holds an open stream and its RNG
            next(stream)
        return clones, streams

    (clones, _streams), held, rss_growth = held_and_grown(open_streams)

    shared = factory.model.weights
    weight_bytes = sum(a.nbytes for a in shared.values())
    assert weight_bytes > 60_000_000  # ~63 MB of float32 weights
    for session in [primary, *clones]:
        assert session.model is factory.model
        assert session.model.weights is shared
    per_session = held / (SESSIONS - 1)
    print(
        f"piper: weights {weight_bytes} B once; per-session private {per_session:.0f} B "
        f"(open stream, last chunk's audio); RSS growth for {SESSIONS - 1} clones {rss_growth} B"
    )
    assert per_session < 256 * 1024  # RNG, generator frame, one sentence chunk (~10 kB audio)
    assert rss_growth < weight_bytes / 4  # 15 more sessions cost far less than a weight copy
    for session in clones:
        session.close()
