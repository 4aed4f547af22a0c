"""Silero VAD as a batched engine (issue #14): many requests, one LSTM forward per step.

Each member owns one row of state: LSTM ``(h, c)`` (``[1, 128]`` each), its framed
windows (the 64-sample context of every chunk is folded in by framing, as a
session frames them), the chunks processed so far and, for a stream, its
:class:`~backends.silero_vad.segments.StreamTrigger`.

A step advances every member by up to :data:`STEP_CHUNKS` 512-sample chunks
(``model.STREAM_BLOCK`` = 8 chunks, 256 ms of audio, the block a streaming session
encodes at once): the members' next windows go time-major into one
:func:`~backends.silero_vad.model.forward` (one encoder pass over every window,
one LSTM walk of 8 time steps over the members' rows), the code ``Session.batch``
runs. A member with fewer chunks left is zero-padded at the end of the block; it
finishes in that step, so its padded steps never feed a kept probability.
Members of any length join and leave between steps.

* A run member (``stream=False``) emits one chunk when its last chunk is
  processed: the :class:`VadResult` ``Session.run`` returns (segments by
  :func:`~backends.silero_vad.segments.speech_segments`).
* A stream member emits, each step, the :class:`VadChunk` s of the chunks it
  processed, as ``Session.stream`` yields them on a fresh session: a member
  always starts clean (``continue_stream`` has no earlier stream to continue),
  and with ``final=False`` a trailing partial chunk stays unprocessed.

Probabilities agree with the unbatched session to float32 rounding (the LSTM's
products run over ``M`` rows instead of one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs
import numpy as np

from backends.base import Array, ArrayBackend
from backends.silero_vad import model
from backends.silero_vad.segments import StreamTrigger, chunk_events, speech_segments
from backends.silero_vad.types import VadChunk, VadRequest, VadResult, checked_request
from backends.silero_vad.weights import SileroWeights
from core.engine import Emitted, Member, join_each

STEP_CHUNKS: Final = model.STREAM_BLOCK  # chunks per member per step (8 x 32 ms = 256 ms)


@attrs.define(eq=False)
class _Row:
    """One member's private state: its windows, LSTM state and what it produced so far."""

    request: VadRequest
    stream: bool
    windows: np.ndarray  # [chunks, 576]
    h: Array  # [1, 128]
    c: Array
    trigger: StreamTrigger
    done: int = 0  # chunks processed
    probs: list[np.ndarray] = attrs.field(factory=list)  # run members: per-step blocks

    @property
    def finished(self) -> bool:
        return self.done >= len(self.windows)


class SileroVadEngine:
    """A :class:`core.engine.BatchEngine` over one factory's shared weights (see module doc)."""

    def __init__(self, backend: ArrayBackend, weights: SileroWeights, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"silero_vad: max_batch must be at least 1, got {max_batch}")
        self.backend = backend
        self.weights = weights
        self._max_batch = max_batch
        self._rows: dict[int, _Row] = {}

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Validate and frame each member; one with no chunk at all is done at once."""
        return join_each(members, self._join_one)

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """Up to :data:`STEP_CHUNKS` chunks for every member in ``keys``, in one forward."""
        rows = {k: self._rows[k] for k in keys if k in self._rows and not self._rows[k].finished}
        probs = self._forward(rows)
        out = []
        for key in keys:
            row = rows.get(key)
            if row is None:
                out.append(Emitted(key, error=KeyError(f"silero_vad: no active member {key}")))
                continue
            result = probs[key]
            if isinstance(result, BaseException):
                out.append(Emitted(key, error=result))
                continue
            try:
                out.append(self._emit(key, row, list(result)))
            except Exception as error:  # this member only
                out.append(Emitted(key, error=error))
        return out

    def leave(self, key: int) -> None:
        self._rows.pop(key, None)

    def close(self) -> None:
        self._rows.clear()

    # ---- internals ---------------------------------------------------------
    def _join_one(self, member: Member) -> Emitted:
        row = self._admit(member)
        self._rows[member.key] = row
        return self._emit(member.key, row, []) if row.finished else Emitted(member.key)

    def _admit(self, member: Member) -> _Row:
        if not 0 <= member.key < self._max_batch or member.key in self._rows:
            raise ValueError(f"silero_vad: key {member.key} is out of range or in use")
        request = checked_request(member.request, offline=not member.stream)
        if member.stream:
            windows = model.stream_frames(
                request.audio, request.final, np.zeros(model.CONTEXT, np.float32)
            )
        else:
            windows = model.frame(request.audio)
        be = self.backend
        return _Row(
            request,
            member.stream,
            windows,
            be.zeros((1, model.HIDDEN)),
            be.zeros((1, model.HIDDEN)),
            StreamTrigger(request.options),
        )

    def _forward(self, rows: dict[int, _Row]) -> dict[int, np.ndarray | BaseException]:
        """The next block's probabilities per member; a member whose forward fails gets its error.

        All members go in one forward; should that fail, each is retried alone so
        that the failure lands on the member that caused it.
        """
        if not rows:
            return {}
        try:
            return dict(zip(rows, self._forward_rows(list(rows.values())), strict=True))
        except Exception:
            out: dict[int, np.ndarray | BaseException] = {}
            for key, row in rows.items():
                try:
                    out[key] = self._forward_rows([row])[0]
                except Exception as error:
                    out[key] = error
            return out

    def _forward_rows(self, rows: list[_Row]) -> list[np.ndarray]:
        """One batched forward of every row's next block; updates each row's state."""
        be, w = self.backend, self.weights
        blocks = [row.windows[row.done : row.done + STEP_CHUNKS] for row in rows]
        steps = max(len(b) for b in blocks)
        h = rows[0].h if len(rows) == 1 else be.concat([row.h for row in rows], 0)
        c = rows[0].c if len(rows) == 1 else be.concat([row.c for row in rows], 0)
        windows = be.to_device(model.time_major(blocks, steps))
        probs, h, c = model.forward(be, w, windows, h, c)
        host = be.to_host(probs)
        out = []
        for j, (row, block) in enumerate(zip(rows, blocks, strict=True)):
            row.h, row.c = be.slice(h, 0, j, j + 1), be.slice(c, 0, j, j + 1)
            row.done += len(block)
            out.append(np.array(host[: len(block), j], dtype=np.float32))
        return out

    def _emit(self, key: int, row: _Row, probs: list[float]) -> Emitted:
        """What ``row`` produced from its latest block's probabilities ``probs``."""
        if row.stream:
            return Emitted(key, self._chunks(row, probs), done=row.finished)
        row.probs.append(np.asarray(probs, dtype=np.float32))
        if not row.finished:
            return Emitted(key)
        audio = row.request.audio
        p = np.concatenate(row.probs) if row.probs else np.zeros(0, np.float32)
        segments = speech_segments(p, len(audio), row.request.options)
        return Emitted(key, (VadResult(p, segments, len(audio)),), done=True)

    def _chunks(self, row: _Row, probs: list[float]) -> tuple[VadChunk, ...]:
        """The stream chunks of the block that ended at chunk ``row.done``."""
        total = len(row.request.audio)
        first = row.done - len(probs)
        chunks = []
        for i, prob in enumerate(probs):
            index = first + i
            last = row.request.final and index == len(row.windows) - 1
            end = (index + 1) * model.CHUNK
            events = chunk_events(row.trigger, float(prob), end, total, last)
            chunks.append(VadChunk(index, index * model.CHUNK, float(prob), events))
        return tuple(chunks)
