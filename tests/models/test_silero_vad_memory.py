"""16 sessions of one factory hold one copy of the weights; each adds only its small state."""

from __future__ import annotations

import numpy as np

from backends.silero_vad import SileroVadSession, VadRequest, load_factory
from tests.models.memory import held_and_grown
from tests.models.silero_vad_reference import fixture

SESSIONS = 16


def _open_stream(session: SileroVadSession, audio: np.ndarray) -> None:
    """Leave the session holding live stream state (LSTM, context, pending samples)."""
    list(session.stream(VadRequest(audio, final=False)))


def test_sixteen_sessions_share_one_copy_of_the_weights() -> None:
    factory = load_factory()
    audio = np.array(fixture()[0][: 512 * 31 + 300])
    primary = factory.create()
    _open_stream(primary, audio)  # warm-up: allocator pools, lazy imports

    def open_streams() -> list[SileroVadSession]:
        clones = [factory.clone(primary) for _ in range(SESSIONS - 1)]
        for session in clones:
            _open_stream(session, audio)
        return clones

    clones, held, rss_growth = held_and_grown(open_streams)

    sessions = [primary, *clones]
    shared = factory.weights.arrays()
    for session in sessions:
        assert session.weights is factory.weights
        assert all(a is b for a, b in zip(session.weights.arrays(), shared, strict=True))
    weight_bytes = sum(a.nbytes for a in shared)
    assert weight_bytes > 1_000_000  # ~1.2 MB of float32 weights

    per_session = held / (SESSIONS - 1)
    print(
        f"silero_vad: weights {weight_bytes} B once; per-session private {per_session:.0f} B; "
        f"RSS growth for {SESSIONS - 1} clones {rss_growth} B"
    )
    assert per_session < 16 * 1024  # LSTM (h, c), context, pending samples, bookkeeping
    assert rss_growth < weight_bytes  # 15 more sessions cost less than one more copy
    states = [session._stream for session in sessions]
    for state in states:
        assert state is not None and state.pending.size == 300
    for i, a in enumerate(states):
        for b in states[i + 1 :]:
            assert a is not None and b is not None
            assert not np.shares_memory(a.h, b.h) and not np.shares_memory(a.c, b.c)
