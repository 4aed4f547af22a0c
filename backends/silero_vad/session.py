"""Silero VAD sessions and their factory (seed 002: shared weights, private state).

A session owns only its streaming state: LSTM (h, c), the 64-sample context,
stream position, pending samples and the trigger. ``run`` and ``batch`` start
from a clean state of their own every time, so an offline result never depends
on which session ran it or what it ran before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

import attrs
import numpy as np

from backends.base import Array, ArrayBackend, session_backend
from backends.identity import HasIdentity, Identity
from backends.silero_vad import model
from backends.silero_vad.batched import MATHS, SileroVadEngine
from backends.silero_vad.segments import StreamTrigger, chunk_events, speech_segments
from backends.silero_vad.types import (
    VadChunk,
    VadOptions,
    VadRequest,
    VadResult,
    checked_request,
)
from backends.silero_vad.weights import SileroWeights
from core.pool import MAX_PARALLEL_SESSIONS, Interface

FAMILY: Final = "silero_vad"
TASK: Final = "vad"
MODES: Final = ("offline", "streaming")
INTERFACES: Final = frozenset({Interface.OFFLINE, Interface.STREAMING, Interface.BATCH})


@attrs.define
class _StreamState:
    """Everything a stream carries from one chunk to the next."""

    h: Array  # device arrays [1, 128]
    c: Array
    context: np.ndarray
    pending: np.ndarray
    position: int  # samples consumed into processed chunks
    index: int  # chunks processed
    trigger: StreamTrigger

    @classmethod
    def fresh(cls, backend: ArrayBackend, options: VadOptions) -> _StreamState:
        return cls(
            h=backend.zeros((1, model.HIDDEN)),
            c=backend.zeros((1, model.HIDDEN)),
            context=np.zeros(model.CONTEXT, np.float32),
            pending=np.zeros(0, np.float32),
            position=0,
            index=0,
            trigger=StreamTrigger(options),
        )


class SileroVadSession(HasIdentity):
    """One VAD execution context over shared weights."""

    def __init__(self, backend: ArrayBackend, weights: SileroWeights, mode: str) -> None:
        self.backend = backend
        self.weights = weights
        self.identity = Identity(FAMILY, TASK, mode, INTERFACES)
        self._stream: _StreamState | None = None
        self._closed = False

    # ---- offline / batch -------------------------------------------------
    def run(self, request: VadRequest) -> VadResult:
        return self.batch([request])[0]

    def batch(self, requests: Sequence[VadRequest]) -> list[VadResult]:
        """All members' chunks in one forward pass (time-major, member per batch row).

        Shorter members are zero-padded at the end; their padded steps come after
        their last real chunk, so they never influence the kept probabilities.
        """
        self._check_open()
        reqs = [checked_request(r, offline=True) for r in requests]
        if not reqs:
            return []
        frames = [model.frame(r.audio) for r in reqs]
        steps = max(len(f) for f in frames)
        probs = np.zeros((steps, len(reqs)), np.float32)
        if steps:
            zeros = self.backend.zeros((len(reqs), model.HIDDEN))
            probs = self._forward(model.time_major(frames, steps), zeros, zeros)[0]
        results = []
        for j, (r, f) in enumerate(zip(reqs, frames, strict=True)):
            p = np.array(probs[: len(f), j], dtype=np.float32)
            results.append(VadResult(p, speech_segments(p, len(r.audio), r.options), len(r.audio)))
        return results

    # ---- streaming -------------------------------------------------------
    def stream(self, request: VadRequest) -> Iterator[VadChunk]:
        """Yield one :class:`VadChunk` per 512-sample chunk, computed as it is pulled."""
        self._check_open()
        req = checked_request(request, offline=False)
        if not req.continue_stream or self._stream is None:
            self._stream = _StreamState.fresh(self.backend, req.options)
        else:
            self._stream.trigger.options = req.options
        return self._stream_chunks(self._stream, req)

    def _stream_chunks(self, st: _StreamState, req: VadRequest) -> Iterator[VadChunk]:
        """Encode ``model.STREAM_BLOCK`` received chunks at a time; step the LSTM per chunk.

        Encoding is per window, so blocking changes no result; the state is
        updated chunk by chunk, so a stream dropped half-way can be continued.
        """
        be, w = self.backend, self.weights
        data = np.concatenate([st.pending, req.audio])
        total = st.position + len(data)
        windows = model.stream_frames(data, req.final, st.context)
        n = len(windows)
        st.pending = data
        for lo in range(0, n, model.STREAM_BLOCK):
            hi = min(lo + model.STREAM_BLOCK, n)
            feats = model.encode_all(be, w, be.to_device(windows[lo:hi]))
            for j in range(lo, hi):
                feat = be.reshape(be.slice(feats, 0, j - lo, j - lo + 1), (1, 1, model.HIDDEN))
                probs, st.h, st.c = model.recur(be, w, feat, st.h, st.c)
                prob = float(be.to_host(probs)[0, 0])
                st.context = windows[j, -model.CONTEXT :].copy()
                st.pending = data[(j + 1) * model.CHUNK :]
                start = st.position
                st.position += model.CHUNK
                st.index += 1
                last = req.final and j == n - 1
                events = chunk_events(st.trigger, prob, st.position, total, last)
                yield VadChunk(st.index - 1, start, prob, events)
        st.pending = data[n * model.CHUNK :].copy()

    def _forward(self, windows: np.ndarray, h: Array, c: Array) -> tuple[np.ndarray, Array, Array]:
        be = self.backend
        probs, h_new, c_new = model.forward(be, self.weights, be.to_device(windows), h, c)
        return be.to_host(probs), h_new, c_new

    # ---- lifecycle -------------------------------------------------------
    def reset(self) -> None:
        """Drop the stream state; the next stream starts from zeros."""
        self._stream = None

    def close(self) -> None:
        """Free private state only; the shared weights belong to the factory."""
        self._stream = None
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("silero_vad: session is closed")


class SileroVadFactory(HasIdentity):
    """A loaded Silero VAD: weights uploaded once, shared by up to 16 sessions."""

    def __init__(
        self,
        backend: ArrayBackend,
        weights: SileroWeights,
        mode: str = "offline",
        batch_math: str = "exact",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"silero_vad: unknown mode {mode!r}; expected one of {MODES}")
        if batch_math not in MATHS:
            raise ValueError(f"silero_vad: batch_math must be one of {MATHS}, got {batch_math!r}")
        self.backend = backend
        self.weights = weights
        self.batch_math = batch_math
        self.identity = Identity(FAMILY, TASK, mode, INTERFACES)

    def capacity(self) -> int:
        return MAX_PARALLEL_SESSIONS

    def create(self) -> SileroVadSession:
        return SileroVadSession(session_backend(self.backend), self.weights, self.mode)

    def engine(self, max_batch: int) -> SileroVadEngine:
        """A batched executor: up to ``max_batch`` requests advance in one LSTM forward per step
        (its products as ``batch_math`` says: see :mod:`backends.silero_vad.batched`)."""
        return SileroVadEngine(
            session_backend(self.backend), self.weights, max_batch, self.batch_math
        )

    def clone(self, primary: object) -> SileroVadSession:
        if not isinstance(primary, SileroVadSession) or primary.weights is not self.weights:
            raise ValueError("silero_vad: clone() needs a primary session of this factory")
        return SileroVadSession(session_backend(self.backend), primary.weights, primary.mode)
