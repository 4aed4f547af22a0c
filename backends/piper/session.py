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
from functools import partial

import numpy as np

from backends.base import session_backend
from backends.identity import HasIdentity, Identity
from backends.piper.api import (
    FrameLimitError,
    PiperChunk,
    PiperRequest,
    PiperResult,
)
from backends.piper.batched import PiperEngine
from backends.piper.model import PiperModel, Synthesis
from backends.piper.progress import Progress, check_request, request_rng, result_of
from core.pool import MAX_PARALLEL_SESSIONS, Interface
from core.stopping import stop_point

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
        """The whole request, every sentence's latent first: the text encoder, durations and
        noise of each (about a sixth of the work) and so the request's frame total before
        any flow or vocoder runs, so that a request over its speech limits fails after that
        sixth, not after synthesizing up to the limit. Decoding draws no noise, so the RNG
        gives each sentence what :meth:`stream` gives it, and the bytes are the same. Costs
        holding the latents (192 floats a frame: 0.07 MiB a second of speech)."""
        self._check(request)
        self._rng = rng = request_rng(request)
        progress = Progress.start(self.model, request, rng)
        latents = progress.plan(partial(self.model.latent, self.backend), None, stop_point)
        chunks = []
        for index, latent in latents:
            stop_point()
            chunks.append(progress.output(index, self.model.decode_one(self.backend, latent.z_p)))
        return result_of(tuple(chunks), self.model.config.sample_rate)

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
        check_request(request)

    def _chunks(self, request: PiperRequest) -> Iterator[PiperChunk]:
        self._check(request)
        self._rng = rng = request_rng(request)
        return self._generate(request, rng)

    def _generate(self, request: PiperRequest, rng: np.random.Generator) -> Iterator[PiperChunk]:
        progress = Progress.start(self.model, request, rng)
        while not progress.done:
            stop_point()  # between sentences (core.stopping)
            item = progress.next_input()
            try:
                synthesis: Synthesis | Exception = self.model.synthesize_ids(
                    item.phoneme_ids,
                    item.noise_scale,
                    item.length_scale,
                    item.noise_w,
                    item.rng,
                    self.backend,
                    item.max_frames,
                )
            except FrameLimitError as exc:
                synthesis = exc
            yield progress.finish(synthesis)


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

    def engine(self, max_batch: int) -> PiperEngine:
        """A batched executor: up to ``max_batch`` requests, one sentence each per step,
        synthesized as one packed batch (:mod:`backends.piper.batched`)."""
        return PiperEngine(self.model, session_backend(self.model.backend), max_batch)

    def clone(self, primary: PiperSession) -> PiperSession:
        if not isinstance(primary, PiperSession) or primary.model is not self.model:
            raise ValueError("clone: primary is not a session of this Piper factory")
        return PiperSession(self.model, self.mode)
