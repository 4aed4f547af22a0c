"""16 Whisper sessions of one factory hold one copy of the weights."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from backends.intrinsics import HALVES
from backends.whisper import WhisperRequest, load_factory, model
from tests.models.memory import rss_bytes
from tests.models.whisper_audio import CLIP, read_pcm

SESSIONS = 16


pytestmark = pytest.mark.usefixtures("one_thread")


def test_sixteen_sessions_share_one_copy_of_the_weights() -> None:
    rss_start = rss_bytes()
    factory = load_factory()
    gc.collect()
    rss_loaded = rss_bytes()
    shared = factory.weights.arrays()
    weight_bytes = sum(a.nbytes for a in shared)
    assert sum(a.size for a in shared) > 37_800_000  # ~37.8 M parameters, panels padded
    # the decoder's step weights and the tied embedding (28.2 M) packed as halves' bits
    # where the CPU converts halves: every value of the float16 checkpoint is one
    halves = sum(a.size for a in shared if a.dtype == np.uint16)
    assert halves > 28_000_000 if HALVES else halves == 0
    assert weight_bytes == 4 * sum(a.size for a in shared) - 2 * halves

    request = WhisperRequest(read_pcm(CLIP))
    primary = factory.create()
    result = primary.run(request)  # warm-up: allocator pools, lazy imports
    assert result.segments
    assert primary.state.cross_v == []  # a finished request leaves no window state behind
    encoder_out = model.encode(
        factory.backend, factory.weights, np.zeros((1, 80, 3000), np.float32)
    )
    gc.collect()
    prompt = np.arange(64, dtype=np.int64)[None]
    rss_before = rss_bytes()
    clones = [factory.clone(primary) for _ in range(SESSIONS - 1)]
    for session in clones:  # every session fills its own caches (a window and 64 positions)
        session.state.set_memory(encoder_out)
        model.decode(factory.backend, factory.weights, session.state, prompt)
    gc.collect()
    rss_growth = rss_bytes() - rss_before
    live_state = clones[0].state.nbytes()

    sessions = [primary, *clones]
    for session in sessions:
        assert session.weights is factory.weights
        assert all(a is b for a, b in zip(session.weights.arrays(), shared, strict=True))
    state_bytes = primary.state.nbytes()
    print(
        f"whisper: weights {weight_bytes / 1e6:.1f} MB once "
        f"(load RSS +{(rss_loaded - rss_start) / 1e6:.1f} MB); "
        f"per-session KV cache {state_bytes / 1e6:.1f} MB allocated, "
        f"{live_state / 1e6:.1f} MB with a "
        f"window's cross K/V; RSS growth for "
        f"{SESSIONS - 1} clones {rss_growth / 1e6:.1f} MB "
        f"({rss_growth / (SESSIONS - 1) / 1e6:.2f} MB each)"
    )
    assert state_bytes == 4 * 2 * 6 * 448 * 64 * 4  # self-attention K/V, 4 layers, 448 positions
    per_session = rss_growth / (SESSIONS - 1)
    # each clone holds only its private state (cross K/V 18.4 MB + touched self K/V), never weights
    assert per_session < 1.5 * live_state  # RSS also counts allocator slack from temporaries
    assert per_session < weight_bytes / 3  # a copy of the weights would be all of them
