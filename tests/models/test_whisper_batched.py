"""Whisper's batched engine (#14) against the unbatched session (tiny.en, one BLAS thread).

Token ids must equal the session's on every request at batch sizes 1, 2, 4, 8 and 16;
a divergence is tolerated only at a step where the session's two best (masked)
logits are within 1e-3 (the near-tie rule of test_whisper_parity.py: a batched
product rounds differently from a one-row product). Members join as keys free up
(so while others are mid-decode), fail alone, leave and have their keys reused;
stream members yield the session's segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from backends.whisper import Segment, WhisperFactory, WhisperRequest, WhisperResult
from core.engine import BatchEngine, Emitted, Member
from tests.models.batching import check_offers_an_engine
from tests.models.test_whisper_parity import TIE
from tests.models.whisper_audio import FIXTURES, load_wav

LOGPROB = 1e-4  # summed log-probabilities of identical tokens agree to float32 rounding


pytestmark = pytest.mark.usefixtures("one_thread")


def _audio(name: str) -> np.ndarray:
    return load_wav(next(str(f["file"]) for f in FIXTURES if f["name"] == name))


@pytest.fixture(scope="module")
def requests() -> list[WhisperRequest]:
    """Every fixture, then three variants: word timestamps, a prompt, sampling fallback."""
    out = [WhisperRequest(_audio(str(f["name"])), record_top2=True) for f in FIXTURES]
    out += [
        WhisperRequest(_audio("short"), word_timestamps=True, record_top2=True),
        WhisperRequest(_audio("weather"), initial_prompt="Forecast.", record_top2=True),
        WhisperRequest(
            _audio("short"), temperature=(0.6, 0.8), best_of=2, seed=5, record_top2=True
        ),
    ]
    assert len(out) == 8
    return out


@pytest.fixture(scope="module")
def expected(
    whisper_factory: WhisperFactory, requests: list[WhisperRequest]
) -> list[WhisperResult]:
    session = whisper_factory.create()
    return [session.run(r) for r in requests]


def _drive(engine: BatchEngine, members: Sequence[tuple[Any, bool]]) -> list[list[Emitted]]:
    """Run ``members`` (request, stream) through ``engine``: each joins as soon as a key is
    free, every active member steps, finished members leave and free their keys.

    Returns each member's :class:`Emitted` entries (its join's first), in member order.
    """
    pending = list(enumerate(members))
    free = list(range(engine.max_batch))
    owner: dict[int, int] = {}
    seen: list[list[Emitted]] = [[] for _ in members]
    active: list[int] = []

    def record(emitted: Emitted) -> None:
        seen[owner[emitted.key]].append(emitted)
        if emitted.done or emitted.error is not None:
            engine.leave(emitted.key)
            free.append(emitted.key)
            active.remove(emitted.key)

    while pending or active:
        arrivals = []
        while pending and free:
            index, (request, stream) = pending.pop(0)
            key = free.pop(0)
            owner[key] = index
            arrivals.append(Member(key, request, stream))
        active.extend(m.key for m in arrivals)
        for emitted in engine.join(arrivals):
            record(emitted)
        if active:
            for emitted in engine.step(list(active)):
                record(emitted)
    return seen


def _result(entries: list[Emitted]) -> WhisperResult:
    assert all(e.error is None for e in entries), [e.error for e in entries]
    assert entries[-1].done and not any(e.done for e in entries[:-1])
    assert all(not e.chunks for e in entries[:-1])
    (result,) = entries[-1].chunks
    assert isinstance(result, WhisperResult)
    return result


def _segment_view(segments: Sequence[Segment]) -> list[tuple[Any, ...]]:
    """What must be identical (word probabilities are compared to float32 rounding)."""
    view = []
    for s in segments:
        words = None if s.words is None else [(w.word, w.start, w.end) for w in s.words]
        view.append((s.start, s.end, s.text, s.tokens, s.seek, s.temperature, words))
    return view


def _word_probabilities(segments: Sequence[Segment]) -> np.ndarray:
    return np.array([w.probability for s in segments for w in s.words or ()])


def _matches(ours: WhisperResult, theirs: WhisperResult) -> str:
    """'identical', or 'near tie' if the first differing token was a near tie for the session."""
    for mine, reference in zip(ours.windows, theirs.windows, strict=False):
        assert mine.seek == reference.seek
        a, b = mine.result.tokens, reference.result.tokens
        if a != b:
            step = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            step = min(len(a), len(b)) if step is None else step
            assert reference.result.top2 is not None
            best, second = reference.result.top2[step]
            assert best - second < TIE, f"divergence at step {step} is not a near tie"
            return "near tie"
        assert abs(mine.result.sum_logprob - reference.result.sum_logprob) < LOGPROB
    assert len(ours.windows) == len(theirs.windows)
    assert _segment_view(ours.segments) == _segment_view(theirs.segments)
    mine, reference = _word_probabilities(ours.segments), _word_probabilities(theirs.segments)
    assert np.abs(mine - reference).max(initial=0) < LOGPROB
    assert ours.text == theirs.text and ours.duration == theirs.duration
    return "identical"


def test_factory_offers_an_engine(whisper_factory: WhisperFactory) -> None:
    check_offers_an_engine(whisper_factory, 3)


@pytest.mark.parametrize(("batch", "count"), [(1, 8), (2, 8), (4, 8), (8, 8), (16, 16)])
def test_batched_tokens_equal_the_session(
    whisper_factory: WhisperFactory,
    requests: list[WhisperRequest],
    expected: list[WhisperResult],
    batch: int,
    count: int,
) -> None:
    """Every request (every fixture and the variants; twice over for 16 members) at batch 1
    bit for bit; above, identical up to a near tie. With fewer keys than requests, later
    requests join while earlier ones are mid-decode."""
    wanted = (requests * 2)[:count]
    seen = _drive(whisper_factory.engine(batch), [(r, False) for r in wanted])
    assert len(seen) == count
    verdicts = [_matches(_result(s), e) for s, e in zip(seen, expected * 2, strict=False)]
    if batch == 1:
        assert verdicts == ["identical"] * count
        for entries, reference in zip(seen, expected, strict=False):
            ours = _result(entries)
            assert [w.result for w in ours.windows] == [w.result for w in reference.windows]
    print(f"batch {batch}: {verdicts}")


def test_a_member_joins_while_another_is_mid_decode(
    whisper_factory: WhisperFactory, requests: list[WhisperRequest], expected: list[WhisperResult]
) -> None:
    engine = whisper_factory.engine(2)
    (first,) = engine.join([Member(0, requests[3], False)])
    assert not first.done and first.error is None
    for _ in range(30):
        (entry,) = engine.step([0])
        assert not entry.done and not entry.chunks
    (second,) = engine.join([Member(1, requests[1], False)])
    assert not second.done
    results: dict[int, WhisperResult] = {}
    while len(results) < 2:
        for entry in engine.step([k for k in (0, 1) if k not in results]):
            if entry.done:
                results[entry.key] = _result([entry])
    assert _matches(results[0], expected[3]) in ("identical", "near tie")
    assert _matches(results[1], expected[1]) in ("identical", "near tie")


def test_a_failing_member_does_not_disturb_the_others(
    whisper_factory: WhisperFactory, requests: list[WhisperRequest], expected: list[WhisperResult]
) -> None:
    """A non-request and a prompt of unknown token ids (it fails in its prefill) fail alone."""
    bad_prompt = WhisperRequest(_audio("short"), initial_prompt=(10**6,))
    session = whisper_factory.create()
    errors = []
    for bad in ("not a request", bad_prompt):
        with pytest.raises(Exception) as raised:
            session.run(bad)  # type: ignore[arg-type]
        errors.append(raised.value)
    members = [(requests[0], False), ("not a request", False), (bad_prompt, True)]
    members.append((requests[2], False))
    seen = _drive(whisper_factory.engine(4), members)
    for entries, error in zip((seen[1], seen[2]), errors, strict=True):
        (entry,) = entries
        assert type(entry.error) is type(error) and str(entry.error) == str(error)
        assert not entry.chunks and not entry.done
    assert _matches(_result(seen[0]), expected[0]) == "identical"
    assert _matches(_result(seen[3]), expected[2]) == "identical"


def test_leave_then_reuse_of_the_key(
    whisper_factory: WhisperFactory, requests: list[WhisperRequest], expected: list[WhisperResult]
) -> None:
    engine = whisper_factory.engine(1)
    engine.join([Member(0, requests[2], True)])
    for _ in range(10):
        engine.step([0])
    engine.leave(0)  # aborted mid-window
    engine.leave(0)  # unknown key: a no-op
    (gone,) = engine.step([0])
    assert isinstance(gone.error, KeyError)
    seen = _drive(engine, [(requests[3], False)])
    assert _matches(_result(seen[0]), expected[3]) == "identical"
    engine.close()
    (closed,) = engine.join([Member(0, requests[0], False)])
    assert isinstance(closed.error, RuntimeError) and "closed" in str(closed.error)


def test_stream_members_yield_the_session_segments(
    whisper_factory: WhisperFactory, requests: list[WhisperRequest]
) -> None:
    """The story (two windows) yields its segments window by window; the others at their end."""
    chosen = [requests[4], requests[5], requests[0]]
    seen = _drive(whisper_factory.engine(3), [(r, True) for r in chosen])
    session = whisper_factory.create()
    for entries, request in zip(seen, chosen, strict=True):
        assert all(e.error is None for e in entries) and entries[-1].done
        chunks = [c for e in entries for c in e.chunks]
        assert _segment_view(chunks) == _segment_view(list(session.stream(request)))
    story = [e for e in seen[0] if e.chunks]
    assert len(story) == 2 and not story[0].done  # the first window's segments came early


def test_empty_audio_is_done_at_join(whisper_factory: WhisperFactory) -> None:
    empty = WhisperRequest(np.zeros(0, np.float32))
    run, stream = whisper_factory.engine(2).join([Member(0, empty, False), Member(1, empty, True)])
    assert run.done and stream.done and not stream.chunks
    (result,) = run.chunks
    assert result == whisper_factory.create().run(empty)


def test_members_that_join_together_share_one_encoder_pass(
    whisper_factory: WhisperFactory,
    requests: list[WhisperRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.whisper import model

    batches: list[int] = []
    real = model.encode

    def encode(be: Any, w: Any, mels: Any) -> Any:
        batches.append(int(mels.shape[0]))
        return real(be, w, mels)

    monkeypatch.setattr(model, "encode", encode)
    engine = whisper_factory.engine(4)
    joined = engine.join([Member(k, requests[k], False) for k in range(4)])
    assert [e.error for e in joined] == [None] * 4
    assert batches == [4]  # the four first windows, one pass


def _linear_rows_in_a_step(
    whisper_factory: WhisperFactory,
    members: list[WhisperRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> list[int]:
    """The rows of every linear product in the fourth step of ``members`` decoding together."""
    from backends.whisper import model

    engine = whisper_factory.engine(len(members))
    keys = list(range(len(members)))
    engine.join([Member(k, r, False) for k, r in zip(keys, members, strict=True)])
    for _ in range(3):
        assert not any(e.done or e.error for e in engine.step(keys))
    rows: list[int] = []
    real = model._project

    def project(be: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        rows.append(int(x.shape[0]))
        return real(be, x, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(model, "_project", project)
        assert not any(e.done or e.error for e in engine.step(keys))
    return rows


def test_a_decoding_step_is_one_product_per_layer_for_all_members(
    whisper_factory: WhisperFactory,
    requests: list[WhisperRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four members' step runs as many linear products as one member's (each weight read
    once a step), every product over all four members' rows."""
    alone = _linear_rows_in_a_step(whisper_factory, requests[3:4], monkeypatch)
    together = _linear_rows_in_a_step(whisper_factory, requests[:4], monkeypatch)
    assert len(alone) >= 4 * 4  # tiny.en: 4 layers, several products each
    assert len(together) == len(alone)
    assert min(together) >= 4 and max(alone) == 1
