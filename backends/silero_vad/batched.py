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

* A live member (``stream=True`` with a :class:`~core.engine.Feed`) is a stream
  whose audio arrives while it runs (a live client, 32 ms at a time): each step
  takes what its owner pushed since, frames every whole chunk (the partial one
  stays pending) and advances it by up to :data:`STEP_CHUNKS` of them; with no
  new chunk it sits the step out (no forward, no output). Closing the feed is
  the end of the audio: the trailing partial chunk is zero-padded and processed,
  as ``final=True``. Its chunks equal ``Session.stream`` over the whole audio
  (``final=True``), however the audio was cut into pieces and steps.

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
from core.engine import Emitted, Feed, Member, join_each

STEP_CHUNKS: Final = model.STREAM_BLOCK  # chunks per member per step (8 x 32 ms = 256 ms)


@attrs.define(eq=False)
class _Row:
    """One member's private state: its windows not yet processed, LSTM state and what it
    produced so far; a live member also its feed, the samples not yet framed (a partial
    chunk) and the context of its next window."""

    request: VadRequest
    stream: bool
    windows: np.ndarray  # [chunks, 576]: framed, not yet processed
    h: Array  # [1, 128]
    c: Array
    trigger: StreamTrigger
    done: int = 0  # chunks processed
    probs: list[np.ndarray] = attrs.field(factory=list)  # run members: per-step blocks
    feed: Feed | None = None
    pending: np.ndarray = attrs.field(factory=lambda: np.zeros(0, np.float32))
    context: np.ndarray = attrs.field(factory=lambda: np.zeros(model.CONTEXT, np.float32))
    received: int = 0  # live: samples received so far
    closed: bool = False  # live: the feed's close was taken (its last chunk is framed)

    @property
    def final(self) -> bool:
        """Whether the last window framed is the member's last (a request's ``final``)."""
        return self.closed if self.feed is not None else self.request.final

    @property
    def total(self) -> int:
        """The samples the member has received (the request's, or a live feed's so far)."""
        return self.received if self.feed is not None else len(self.request.audio)

    @property
    def finished(self) -> bool:
        return not len(self.windows) and (self.feed is None or self.closed)

    def take(self) -> None:
        """A live member: frame what its owner pushed since the last take (every whole
        chunk; once the feed is closed, the zero-padded partial chunk too)."""
        if self.feed is None or self.closed:
            return
        pieces, closed = self.feed.take()
        if not pieces and not closed:
            return
        if len(pieces) == 1 and not closed and not len(self.pending):
            piece = np.asarray(pieces[0], np.float32).reshape(-1)
            if len(piece) == model.CHUNK:  # a live client's 32 ms: one window, as frame() makes
                window = np.empty((1, model.WINDOW), np.float32)
                window[0, : model.CONTEXT] = self.context
                window[0, model.CONTEXT :] = piece
                self.context = piece[-model.CONTEXT :].copy()
                self.windows = (
                    np.concatenate([self.windows, window]) if len(self.windows) else window
                )
                self.received += model.CHUNK
                return
        new = [np.asarray(p, np.float32).reshape(-1) for p in pieces]
        data = np.concatenate([self.pending, *new]) if new else self.pending
        self.received += sum(len(p) for p in new)
        self.frame(data, closed)

    def frame(self, data: np.ndarray, closed: bool) -> None:
        """Append the windows of ``data`` (pending samples first) to the backlog."""
        framed = model.stream_frames(data, closed, self.context)
        if len(framed):
            self.context = framed[-1, -model.CONTEXT :].copy()
            self.windows = np.concatenate([self.windows, framed]) if len(self.windows) else framed
        self.pending = data[len(framed) * model.CHUNK :].copy()
        self.closed = closed


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

    @property
    def live_input(self) -> bool:
        """Live members (a :class:`~core.engine.Feed`) are welcome (see the module doc)."""
        return True

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Validate and frame each member; one with no chunk at all is done at once."""
        return join_each(members, self._join_one)

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """Up to :data:`STEP_CHUNKS` chunks for every member in ``keys``, in one forward; a
        live member first takes its new audio, and sits out with no whole chunk to process."""
        taken: dict[int, BaseException] = {}
        for key in keys:
            row = self._rows.get(key)
            if row is not None and row.feed is not None:
                try:
                    row.take()
                except Exception as error:  # this member only
                    taken[key] = error
        rows = {
            k: self._rows[k]
            for k in keys
            if k in self._rows and k not in taken and len(self._rows[k].windows)
        }
        probs = self._forward(rows)
        out = []
        for key in keys:
            row = self._rows.get(key)
            live = row is not None and row.feed is not None
            if key in taken:
                out.append(Emitted(key, error=taken[key]))
                continue
            if row is None or (key not in rows and not live):
                out.append(Emitted(key, error=KeyError(f"silero_vad: no active member {key}")))
                continue
            result = probs.get(key, np.zeros(0, np.float32))
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
        if member.feed is not None:
            return self._admit_live(member, request)
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

    def _admit_live(self, member: Member, request: VadRequest) -> _Row:
        """A live member: its request's audio (often none) is the first piece; the feed's
        pieces follow at each step."""
        if not member.stream or request.continue_stream:
            raise ValueError("silero_vad: a live member is a fresh stream (stream, no continue)")
        be, feed = self.backend, member.feed
        assert feed is not None
        row = _Row(
            request,
            True,
            np.zeros((0, model.WINDOW), np.float32),
            be.zeros((1, model.HIDDEN)),
            be.zeros((1, model.HIDDEN)),
            StreamTrigger(request.options),
            feed=feed,
            received=len(request.audio),
        )
        row.frame(request.audio, False)
        row.take()
        feed.hold(bool(len(row.windows)))
        return row

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
        """Every row's next block, in one batched forward per block length that must be exact
        at its end; updates each row's state.

        A block shorter than the longest is zero-padded, and the LSTM walks on over the
        padding: harmless for a member that ends with that block, not for a live member
        that goes on. So live rows with a shorter block run in a forward of their own
        length (in real time every live block is one chunk long: one forward).
        """
        longest = max(len(row.windows[:STEP_CHUNKS]) for row in rows)
        groups: dict[int, list[int]] = {}
        for j, row in enumerate(rows):
            length = len(row.windows[:STEP_CHUNKS])
            groups.setdefault(length if row.feed is not None else longest, []).append(j)
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)
        for length in sorted(groups, reverse=True):
            members = groups[length]
            forward = self._forward_group([rows[j] for j in members])
            for j, probs in zip(members, forward, strict=True):
                out[j] = probs
        return out

    def _forward_group(self, rows: list[_Row]) -> list[np.ndarray]:
        """One batched forward of every row's next block; updates each row's state."""
        be, w = self.backend, self.weights
        blocks = [row.windows[:STEP_CHUNKS] for row in rows]
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
            row.windows = row.windows[len(block) :]
            if row.feed is not None:
                row.feed.hold(bool(len(row.windows)))
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
        total = row.total
        first = row.done - len(probs)
        chunks = []
        for i, prob in enumerate(probs):
            index = first + i
            last = row.final and index == row.done + len(row.windows) - 1
            end = (index + 1) * model.CHUNK
            events = chunk_events(row.trigger, float(prob), end, total, last)
            chunks.append(VadChunk(index, index * model.CHUNK, float(prob), events))
        return tuple(chunks)
