"""Memory of VAD-chunked Whisper requests (issue #14), measured with tracemalloc.

A batching model's engine keeps nothing of a chunked member once it has left: the decoder
states of its further pieces are its own, not a pool the engine grows.
"""

from __future__ import annotations

import pytest

from backends.whisper import WhisperFactory, WhisperRequest, WhisperResult
from backends.whisper.batched import WhisperEngine
from core.engine import Member
from tests.models.memory import held_and_grown
from tests.models.whisper_audio import load_wav

MIB = 1 << 20

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(engine: WhisperEngine, request: WhisperRequest) -> WhisperResult:
    """``request`` alone through ``engine``, from join to leave."""
    (emitted,) = engine.join([Member(0, request, False)])
    while not emitted.done:
        assert emitted.error is None, emitted.error
        (emitted,) = engine.step([0])
    engine.leave(0)
    (result,) = emitted.chunks
    assert isinstance(result, WhisperResult)
    return result


def test_a_chunked_member_leaves_nothing_behind_in_the_engine(
    whisper_factory: WhisperFactory,
) -> None:
    """The story's second piece decodes on a state of its own, gone when the member leaves
    (the engine used to pool such states: 5.5 MB of self-attention cache kept for every piece
    beyond a slot's that chunked members ever had in flight at once)."""
    story = WhisperRequest(load_wav("story.wav"), vad_chunking=True)
    whisper_factory.create().run(story)  # warm-up: the VAD's weights, lazy imports
    engine = whisper_factory.engine(1)
    result, held, _ = held_and_grown(lambda: _run(engine, story))
    assert len(result.pieces) == 2
    print(f"whisper vad_chunking: the engine holds {held / MIB:.2f} MiB more after the member")
    assert held < MIB  # the result itself (segments, tokens) is a few kB
