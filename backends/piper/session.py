"""Piper sessions and their factory: shared immutable model, private RNG per session.

A session's mutable state is the RNG of the request it is running (drawn fresh
from the request's seed, so a seeded request sounds the same on every session,
cold or warm) and the generator of an open stream. The model is shared as is: it
holds only weights and config, and its code keeps all scratch arrays local.

Modes (fixed per loaded model): ``offline`` serves ``run`` and ``batch`` (the
requests one after another, each byte-identical to its ``run``); ``streaming``
serves ``run`` and ``stream`` (one chunk per sentence, piper's sentence split).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from backends.base import session_backend
from backends.identity import HasIdentity, Identity
from backends.piper.api import (
    DEFAULT_SEED,
    AudioLimitError,
    FrameLimitError,
    PiperChunk,
    PiperRequest,
    PiperResult,
)
from backends.piper.model import PiperModel
from backends.piper.phonemize import phoneme_ids, phonemize
from core.pool import MAX_PARALLEL_SESSIONS, Interface

FAMILY = "piper"
TASK = "tts"
MODES: dict[str, frozenset[Interface]] = {
    "offline": frozenset({Interface.OFFLINE, Interface.BATCH}),
    "streaming": frozenset({Interface.OFFLINE, Interface.STREAMING}),
}


class PiperSession(HasIdentity):
    """One execution context over a shared :class:`PiperModel`."""

    def __init__(self, model: PiperModel, mode: str) -> None:
        self.model = model
        self.backend = session_backend(model.backend)
        self.identity = Identity(FAMILY, TASK, mode, MODES[mode])
        self._rng: np.random.Generator | None = None
        self._open: Iterator[PiperChunk] | None = None
        self._closed = False

    def run(self, request: PiperRequest) -> PiperResult:
        chunks = tuple(self._chunks(request))
        audio = (
            np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, dtype=np.float32)
        )
        return PiperResult(audio=audio, sample_rate=self.model.config.sample_rate, chunks=chunks)

    def stream(self, request: PiperRequest) -> Iterator[PiperChunk]:
        self._require(Interface.STREAMING, "stream")
        self._open = self._chunks(request)
        return self._open

    def batch(self, requests: Sequence[PiperRequest]) -> list[PiperResult]:
        """Requests in order, each exactly as ``run`` would give it.

        Sentences are not padded into one tensor: padding would change the
        HiFi-GAN's edge samples and the GEMM shapes, and so the bytes.
        """
        self._require(Interface.BATCH, "batch")
        for request in requests:
            self._check(request)
        return [self.run(request) for request in requests]

    def reset(self) -> None:
        if self._open is not None:
            close = getattr(self._open, "close", None)
            if close is not None:
                close()
        self._open = None
        self._rng = None

    def close(self) -> None:
        self.reset()
        self._closed = True

    # ---- internals ------------------------------------------------------
    def _require(self, interface: Interface, what: str) -> None:
        if interface not in self.interfaces:
            raise ValueError(f"piper session in mode {self.mode!r} does not support {what}()")

    def _check(self, request: PiperRequest) -> None:
        if self._closed:
            raise ValueError("piper session is closed")
        if not isinstance(request, PiperRequest):
            raise TypeError(f"expected PiperRequest, got {type(request).__name__}")
        if request.speaker is not None:
            raise ValueError("this Piper voice has a single speaker: leave speaker unset")

    def _chunks(self, request: PiperRequest) -> Iterator[PiperChunk]:
        self._check(request)
        cfg = self.model.config
        noise_scale = cfg.noise_scale if request.noise_scale is None else request.noise_scale
        length_scale = cfg.length_scale if request.length_scale is None else request.length_scale
        noise_w = cfg.noise_w if request.noise_w is None else request.noise_w
        seed = DEFAULT_SEED if request.seed is None else request.seed
        self._rng = rng = np.random.default_rng(seed)
        return self._generate(request, rng, noise_scale, length_scale, noise_w)

    def _generate(
        self,
        request: PiperRequest,
        rng: np.random.Generator,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
    ) -> Iterator[PiperChunk]:
        cfg = self.model.config
        frame_seconds = self.model.hyper.hop_length / cfg.sample_rate
        used = 0  # frames produced so far
        for index, phonemes in enumerate(p for p in phonemize(request.text, cfg) if p):
            ids = phoneme_ids(phonemes, cfg)
            budget, limit, seconds = _frame_budget(request, used, frame_seconds)
            try:
                synthesis = self.model.synthesize_ids(
                    np.asarray(ids), noise_scale, length_scale, noise_w, rng, self.backend, budget
                )
            except FrameLimitError as exc:
                needed = (used if limit == "request" else 0) + exc.frames
                raise AudioLimitError(limit, seconds, needed * frame_seconds) from None
            used += max(int(synthesis.durations.sum()), 1)
            audio = synthesis.audio
            if request.normalize_audio:
                peak = float(np.max(np.abs(audio)))
                audio = np.zeros_like(audio) if peak < 1e-8 else audio / np.float32(peak)
            if request.volume != 1.0:
                audio = audio * np.float32(request.volume)
            audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
            yield PiperChunk(
                index=index,
                phonemes=tuple(phonemes),
                phoneme_ids=tuple(ids),
                audio=audio,
                sample_rate=cfg.sample_rate,
            )


def _frame_budget(
    request: PiperRequest, used: int, frame_seconds: float
) -> tuple[int | None, str, float]:
    """Frames the next sentence may take, which limit binds, and that limit in seconds."""
    options: list[tuple[int, str, float]] = []
    if request.max_seconds is not None:
        total = int(request.max_seconds / frame_seconds)
        options.append((max(total - used, 0), "request", request.max_seconds))
    if request.max_sentence_seconds is not None:
        options.append(
            (
                int(request.max_sentence_seconds / frame_seconds),
                "sentence",
                request.max_sentence_seconds,
            )
        )
    if not options:
        return None, "", 0.0
    return min(options)


class PiperFactory(HasIdentity):
    """A loaded Piper voice: the shared model plus the recipe for sessions."""

    def __init__(self, model: PiperModel, mode: str = "offline") -> None:
        if mode not in MODES:
            raise ValueError(f"piper mode must be one of {sorted(MODES)}, got {mode!r}")
        self.model = model
        self.identity = Identity(FAMILY, TASK, mode, MODES[mode])

    def capacity(self) -> int:
        return MAX_PARALLEL_SESSIONS

    def create(self) -> PiperSession:
        return PiperSession(self.model, self.mode)

    def clone(self, primary: PiperSession) -> PiperSession:
        if not isinstance(primary, PiperSession) or primary.model is not self.model:
            raise ValueError("clone: primary is not a session of this Piper factory")
        return PiperSession(self.model, self.mode)
