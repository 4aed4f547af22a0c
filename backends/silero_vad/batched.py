"""Silero VAD as a batched engine (issue #14): many requests, one LSTM forward per step.

Each member owns a row of the engine's state, indexed by its key: LSTM ``(h, c)``
(rows of two ``[max_batch, 128]`` matrices), a live member's 64-sample context (a row
of ``[max_batch, 64]``) and its trigger's state as the vector test below reads it;
its own bookkeeping (:class:`_Row`) keeps its framed windows not yet processed, the
chunks processed so far and its :class:`~backends.silero_vad.segments.StreamTrigger`.

A step advances every member by up to its *block* of 512-sample chunks in one
forward (:meth:`SileroVadEngine._block`):

* while any live member is in the engine, every member's block is :data:`STEP_CHUNKS`
  (``model.STREAM_BLOCK`` = 8 chunks, 256 ms of audio, the block a streaming session
  encodes at once), so a step stays short and a live chunk waits at most one such step;
* with no live member, one engine call advances its members by at most
  :data:`OFFLINE_STEP_CHUNKS` (512 chunks, 16.4 s of audio) in all, shared out among
  them (at least :data:`STEP_CHUNKS` each): a run member alone takes all 512 and its
  first block is taken in its join, so a request alone costs what ``Session.run``
  costs (which frames every window at once) plus one engine call per 16 s of audio
  (under 1% of the forward's time), instead of one per 256 ms (2.1x the session's
  time). A member arriving meanwhile waits for the engine call in progress, which
  carries about 512 chunks whatever the members (up to 64 of them; 8 chunks each
  beyond): 82-91 ms ("exact") or 55-59 ms ("gemm") at one BLAS thread on a loaded
  2-core machine (``bench/vad_block_wait.py``, docs/performance.md);
* with no live member, a stream member's block doubles from :data:`STEP_CHUNKS` with
  the chunks it processed (8 in its join, then 8, 16, 32, ... up to its share of the
  call): its first chunks come out as early as before, and a long stream takes few
  steps.

A member's results never depend on its blocks (the encoder runs window by window, the
LSTM chunk by chunk), only the number of steps it takes does. The state rows of the
step's members are gathered,
their windows encoded together and walked through the LSTM time-major, each member
for exactly its own number of windows (its state stops after its last), and the
rows written back once the forward succeeded. Members of any length join and leave
between steps; a key's rows are reset when a member joins under it.

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

The common live case (the *quick* members: whole float32 chunks of 512 samples,
nothing pending or held) costs no Python per window: the step stacks their chunks,
frames them with their context rows in one pass, and tests their probabilities for
events all at once (a chunk below the threshold outside speech, or at or above the
exit threshold in speech without cancelling a tentative end, moves no trigger); only
the chunks that may move a trigger go through :class:`StreamTrigger`. Every other
member (a partial piece, a held burst, the close, a request's audio) frames through
its own row as a session would.

``math`` says how the forward multiplies:

* ``"exact"`` (the default): the session's own :func:`~backends.silero_vad.model.forward`,
  whose products run row by row, so every member's probabilities are bit-identical to
  ``Session.run`` / ``Session.stream`` at one BLAS thread, whatever the batch (what
  ``voxpool validate`` checks);
* ``"gemm"`` (host weights only): :func:`~backends.silero_vad.model.host_encode` and
  :func:`~backends.silero_vad.model.host_recur`, one GEMM per layer for all the
  step's windows: about half the forward's CPU, but OpenBLAS rounds a row differently
  with the rows around it, so the probabilities agree with the session's to float32
  rounding (within 1e-5, tested), not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs
import numpy as np

from backends.base import ArrayBackend
from backends.silero_vad import model
from backends.silero_vad.segments import StreamTrigger, chunk_events, speech_segments
from backends.silero_vad.types import (
    VadChunk,
    VadEvent,
    VadRequest,
    VadResult,
    checked_request,
)
from backends.silero_vad.weights import SileroWeights
from core.engine import Emitted, Feed, Member, join_each

STEP_CHUNKS: Final = model.STREAM_BLOCK  # chunks per member per step (8 x 32 ms = 256 ms)
OFFLINE_STEP_CHUNKS: Final = 512
"""With no live member in the engine, the most chunks one engine call advances its members
by in all (shared out, at least :data:`STEP_CHUNKS` each): a lone member's block."""
MATHS: Final = ("exact", "gemm")
"""How a step's forward multiplies (:class:`SileroVadEngine`'s ``math``)."""
_NO_WINDOWS: Final = np.zeros((0, model.WINDOW), np.float32)
_NO_SAMPLES: Final = np.zeros(0, np.float32)


@attrs.define(eq=False)
class _Row:
    """One member's private bookkeeping: its windows not yet processed and what it produced
    so far; a live member also its feed, the samples not yet framed (a partial chunk) and
    whether the close was taken. Its LSTM state and context are rows of the engine's
    matrices (indexed by key)."""

    request: VadRequest
    stream: bool
    trigger: StreamTrigger
    windows: np.ndarray = _NO_WINDOWS  # [chunks, 576]: framed, not yet processed
    done: int = 0  # chunks processed
    probs: list[np.ndarray] = attrs.field(factory=list)  # run members: per-step blocks
    feed: Feed | None = None
    pending: np.ndarray = _NO_SAMPLES
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


def _whole_chunks(pieces: Sequence[object]) -> bool:
    """Whether every piece is one whole chunk as a live client pushes it: float32 [512], at
    most :data:`STEP_CHUNKS` of them."""
    if len(pieces) > STEP_CHUNKS:
        return False
    for piece in pieces:
        if not (
            type(piece) is np.ndarray
            and piece.shape == (model.CHUNK,)
            and piece.dtype == np.float32
        ):
            return False
    return True


class SileroVadEngine:
    """A :class:`core.engine.BatchEngine` over one factory's shared weights (see module doc)."""

    def __init__(
        self, backend: ArrayBackend, weights: SileroWeights, max_batch: int, math: str = "exact"
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"silero_vad: max_batch must be at least 1, got {max_batch}")
        if math not in MATHS:
            raise ValueError(f"silero_vad: batch_math must be one of {MATHS}, got {math!r}")
        self.backend = backend
        self.weights = weights
        self.math = math
        self._max_batch = max_batch
        self._rows: dict[int, _Row] = {}
        self._live = 0  # live members among the rows
        self._gemm = math == "gemm" and model.on_host(weights)
        # per key: LSTM state, a live member's context, its trigger as the vector test sees it
        self._h = np.zeros((max_batch, model.HIDDEN), np.float32)
        self._c = np.zeros((max_batch, model.HIDDEN), np.float32)
        self._context = np.zeros((max_batch, model.CONTEXT), np.float32)
        self._threshold = np.zeros(max_batch)
        self._exit = np.zeros(max_batch)
        self._triggered = np.zeros(max_batch, bool)
        self._tentative = np.zeros(max_batch, bool)  # a tentative end is set

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def live_input(self) -> bool:
        """Live members (a :class:`~core.engine.Feed`) are welcome (see the module doc)."""
        return True

    @property
    def collection_window(self) -> float:
        """0: a member starts at once. Members that join together gain little (a joiner
        advances its first block in its join, one forward each way), and a request alone
        would wait the whole window: 2 ms, a seventh of a 3.5 s file's time."""
        return 0.0

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Validate and frame each member; one with no chunk at all is done at once.

        With no live member in the engine, the members that joined also advance by their
        first block here, in one forward (as the step after would): a request alone whose
        audio fits in one block is done in its join, with no step at all.
        """
        joined = join_each(members, self._join_one)
        if self._live:
            return joined
        slow = [i for i, e in enumerate(joined) if e.error is None and not e.done]
        if not slow:
            return joined
        out: list[Emitted | None] = list(joined)
        self._advance([m.key for m in members], out, [], [], [], slow)
        return out  # type: ignore[return-value]

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """Up to its block of chunks for every member in ``keys``, in one forward; a
        live member first takes its new audio, and sits out with no whole chunk to process.

        The common live case, whole 32 ms chunks pushed as such (one, or a few after a
        late step) and nothing held, is framed, tested for events and emitted with arrays
        over all such members (``quick``); every other member goes through its own row
        (``slow``).
        """
        rows = self._rows
        out: list[Emitted | None] = [None] * len(keys)
        quick: list[int] = []  # positions in keys
        counts: list[int] = []  # the quick members' chunks, in order
        pieces: list[np.ndarray] = []
        slow: list[int] = []
        for i, key in enumerate(keys):
            row = rows.get(key)
            if row is None:
                out[i] = Emitted(key, error=KeyError(f"silero_vad: no active member {key}"))
                continue
            feed = row.feed
            if feed is not None and not row.closed:
                try:
                    taken, closed = feed.take()
                    if (
                        taken
                        and not closed
                        and not len(row.windows)
                        and not len(row.pending)
                        and _whole_chunks(taken)
                    ):
                        quick.append(i)
                        counts.append(len(taken))
                        pieces.extend(taken)
                        continue
                    if taken or closed:
                        self._frame(key, row, taken, closed)
                except Exception as error:  # this member only
                    out[i] = Emitted(key, error=error)
                    continue
            if len(row.windows):
                slow.append(i)
            elif feed is not None:  # nothing new to process: sits the step out
                out[i] = Emitted(key, done=row.finished)
            else:
                out[i] = Emitted(key, error=KeyError(f"silero_vad: no active member {key}"))
        if quick or slow:
            self._advance(keys, out, quick, counts, pieces, slow)
        assert all(e is not None for e in out)
        return out  # type: ignore[return-value]

    def leave(self, key: int) -> None:
        row = self._rows.pop(key, None)
        if row is not None and row.feed is not None:
            self._live -= 1

    def close(self) -> None:
        self._rows.clear()
        self._live = 0

    def _block(self, row: _Row, members: int) -> int:
        """The most chunks ``row`` advances in this step, one of ``members`` that advance from
        their rows (see the module doc): live members in the engine keep every block at
        :data:`STEP_CHUNKS`; otherwise the call's :data:`OFFLINE_STEP_CHUNKS` are shared out
        (at least :data:`STEP_CHUNKS` each): a run member takes its share, and a stream
        member as many as it processed so far, at least :data:`STEP_CHUNKS`, at most its
        share."""
        if self._live:
            return STEP_CHUNKS
        share = max(STEP_CHUNKS, OFFLINE_STEP_CHUNKS // members)
        if not row.stream:
            return share
        return min(share, max(STEP_CHUNKS, row.done))

    # ---- internals ---------------------------------------------------------
    def _join_one(self, member: Member) -> Emitted:
        row = self._admit(member)
        self._rows[member.key] = row
        if row.feed is not None:
            self._live += 1
        return self._emit(member.key, row, []) if row.finished else Emitted(member.key)

    def _admit(self, member: Member) -> _Row:
        key = member.key
        if not 0 <= key < self._max_batch or key in self._rows:
            raise ValueError(f"silero_vad: key {key} is out of range or in use")
        request = checked_request(member.request, offline=not member.stream)
        if member.feed is not None and (not member.stream or request.continue_stream):
            raise ValueError("silero_vad: a live member is a fresh stream (stream, no continue)")
        options = request.options
        self._h[key] = 0.0
        self._c[key] = 0.0
        self._context[key] = 0.0
        self._threshold[key] = options.threshold
        self._exit[key] = options.exit_threshold
        self._triggered[key] = self._tentative[key] = False
        row = _Row(request, member.stream, StreamTrigger(options), feed=member.feed)
        if member.feed is not None:
            # a live member: its request's audio (often none) is the first piece, the feed's
            # pieces follow at each step
            row.received = len(request.audio)
            self._frame(key, row, [], False, request.audio)
            taken, closed = member.feed.take()
            if taken or closed:
                self._frame(key, row, taken, closed)
            member.feed.hold(bool(len(row.windows)))
        elif member.stream:
            row.windows = model.stream_frames(
                request.audio, request.final, np.zeros(model.CONTEXT, np.float32)
            )
        else:
            row.windows = model.frame(request.audio)
        return row

    def _frame(
        self,
        key: int,
        row: _Row,
        taken: Sequence[object],
        closed: bool,
        first: np.ndarray = _NO_SAMPLES,
    ) -> None:
        """A live member: frame what its owner pushed (every whole chunk; once the feed is
        closed, the zero-padded partial chunk too) after its pending samples."""
        new = [np.asarray(p, np.float32).reshape(-1) for p in taken]
        row.received += sum(len(p) for p in new)
        data = np.concatenate([row.pending, first, *new])
        framed = model.stream_frames(data, closed, self._context[key])
        if len(framed):
            self._context[key] = framed[-1, -model.CONTEXT :]
            row.windows = np.concatenate([row.windows, framed]) if len(row.windows) else framed
        row.pending = data[len(framed) * model.CHUNK :].copy()
        row.closed = closed

    def _advance(
        self,
        keys: Sequence[int],
        out: list[Emitted | None],
        quick: list[int],
        counts: list[int],
        pieces: list[np.ndarray],
        slow: list[int],
    ) -> None:
        """One forward over the quick members' new chunks and the slow members' next blocks;
        fills ``out`` at their positions."""
        rows = self._rows
        quick_keys = np.array([keys[i] for i in quick], np.intp)
        windows = self._frame_quick(quick_keys, counts, pieces)
        blocks = [rows[keys[i]].windows[: self._block(rows[keys[i]], len(slow))] for i in slow]
        sizes = [*counts, *(len(b) for b in blocks)]
        members = [keys[i] for i in (*quick, *slow)]
        probs, errors = self._forward(members, sizes, len(quick), windows, blocks)
        if len(quick):
            self._emit_quick(keys, out, quick, quick_keys, counts, probs, errors)
        for j, i in enumerate(slow, start=len(quick)):
            key = keys[i]
            if j in errors:
                out[i] = Emitted(key, error=errors[j])
                continue
            row = rows[key]
            row.done += sizes[j]
            row.windows = row.windows[sizes[j] :]
            if row.feed is not None:
                row.feed.hold(bool(len(row.windows)))
            self._emit_row(key, row, out, i, probs[: sizes[j], j])

    def _frame_quick(
        self, quick_keys: np.ndarray, counts: list[int], pieces: list[np.ndarray]
    ) -> np.ndarray:
        """The quick members' windows [sum(counts), 576], member after member: each chunk
        after the last 64 samples before it (the member's context for its first)."""
        if not pieces:
            return np.zeros((0, model.WINDOW), np.float32)
        chunks = np.concatenate(pieces).reshape(-1, model.CHUNK)  # float32 [512] each
        windows = np.empty((len(chunks), model.WINDOW), np.float32)
        windows[:, model.CONTEXT :] = chunks
        if len(chunks) == len(counts):  # one chunk each
            windows[:, : model.CONTEXT] = self._context[quick_keys]
            self._context[quick_keys] = chunks[:, -model.CONTEXT :]
            return windows
        ends = np.cumsum(counts)
        windows[1:, : model.CONTEXT] = chunks[:-1, -model.CONTEXT :]
        windows[ends - counts, : model.CONTEXT] = self._context[quick_keys]
        self._context[quick_keys] = chunks[ends - 1, -model.CONTEXT :]
        return windows

    def _emit_quick(
        self,
        keys: Sequence[int],
        out: list[Emitted | None],
        quick: list[int],
        quick_keys: np.ndarray,
        counts: list[int],
        probs: np.ndarray,
        errors: dict[int, BaseException],
    ) -> None:
        """The quick members' chunks: events only where the trigger may move.

        A chunk changes nothing of a stream's trigger (so has no event) when it is below the
        threshold outside speech, or, in speech, at or above the exit threshold without
        cancelling a tentative end: that is tested for every member at once, chunk position
        after chunk position, and :class:`StreamTrigger` decides every other chunk.
        """
        rows = self._rows
        members = len(quick)
        steps = max(counts)
        p = probs[:steps, :members].astype(np.float64)
        threshold, exit_ = self._threshold[quick_keys], self._exit[quick_keys]
        triggered, tentative = self._triggered[quick_keys], self._tentative[quick_keys]
        number = np.asarray(counts)
        events: dict[tuple[int, int], tuple[VadEvent, ...]] = {}
        for t in range(steps):
            above = p[t] >= threshold
            moves = np.where(triggered, (p[t] < exit_) | (above & tentative), above)
            if steps > 1:
                moves &= number > t
            for j in np.flatnonzero(moves).tolist():
                if errors and j in errors:
                    continue
                key = keys[quick[j]]
                row = rows[key]
                index = row.done + t
                end = (index + 1) * model.CHUNK
                received = row.received + (t + 1) * model.CHUNK
                events[j, t] = chunk_events(row.trigger, float(p[t, j]), end, received, False)
                triggered[j] = self._triggered[key] = row.trigger.triggered
                tentative[j] = self._tentative[key] = bool(row.trigger.temp_end)
        column = p[0].tolist()
        for j, i in enumerate(quick):
            key = keys[i]
            if errors and j in errors:
                out[i] = Emitted(key, error=errors[j])
                continue
            row = rows[key]
            first = row.done
            n = counts[j]
            row.done = first + n
            row.received += n * model.CHUNK
            if n == 1:
                chunk = VadChunk(first, first * model.CHUNK, column[j], events.get((j, 0), ()))
                out[i] = Emitted(key, (chunk,))
                continue
            out[i] = Emitted(
                key,
                tuple(
                    VadChunk(
                        first + t,
                        (first + t) * model.CHUNK,
                        float(p[t, j]),
                        events.get((j, t), ()),
                    )
                    for t in range(n)
                ),
            )

    def _emit_row(
        self, key: int, row: _Row, out: list[Emitted | None], i: int, probs: np.ndarray
    ) -> None:
        """A slow member's output from its block's probabilities; its trigger's mirror."""
        try:
            out[i] = self._emit(key, row, probs.tolist())
        except Exception as error:  # this member only
            out[i] = Emitted(key, error=error)
        self._triggered[key] = row.trigger.triggered
        self._tentative[key] = bool(row.trigger.temp_end)

    def _forward(
        self,
        keys: Sequence[int],
        sizes: Sequence[int],
        quick: int,
        windows: np.ndarray,
        blocks: Sequence[np.ndarray],
    ) -> tuple[np.ndarray, dict[int, BaseException]]:
        """Probabilities [T, B] of every member's next windows (member ``j``'s in its first
        ``sizes[j]`` rows of column ``j``), and the members whose forward failed, by
        position; updates the state rows of the others.

        The first ``quick`` members' windows, one after the other in ``windows``, and the
        slow members' ``blocks`` go in one forward; should that fail, each member is retried
        alone, so that the failure lands on the member that caused it.
        """
        try:
            return self._run(keys, sizes, [windows, *blocks]), {}
        except Exception:
            probs = np.zeros((max(sizes), len(keys)), np.float32)
            errors: dict[int, BaseException] = {}
            starts = np.cumsum([0, *sizes[:quick]]).tolist()
            own = [windows[starts[j] : starts[j + 1]] for j in range(quick)]
            for j, (key, mine) in enumerate(zip(keys, [*own, *blocks], strict=True)):
                try:
                    probs[: sizes[j], j] = self._run([key], [sizes[j]], [mine])[:, 0]
                except Exception as error:
                    errors[j] = error
            return probs, errors

    def _run(
        self, keys: Sequence[int], sizes: Sequence[int], windows: Sequence[np.ndarray]
    ) -> np.ndarray:
        """One forward of the members ``keys``, whose windows are ``windows`` concatenated
        (``sizes[j]`` for member ``j``) -> probs [T, B]; a member's state row is written
        only once the forward succeeded, with its state after its own last window."""
        index = np.asarray(keys, np.intp)
        h, c = self._h[index], self._c[index]
        flat = windows[0] if len(windows) == 1 else np.concatenate(windows)
        if self._gemm:
            feats = model.host_encode(self.weights, flat)
            steps = max(sizes)
            if steps == 1:
                probs, h, c = model.host_recur(self.weights, feats[None], h, c)
            else:  # time-major, each member's windows from step 0, the rest zeros
                counts = np.asarray(sizes, np.intp)
                member = np.repeat(np.arange(len(keys)), counts)
                at = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
                timed = np.zeros((steps, len(keys), model.HIDDEN), np.float32)
                timed[at, member] = feats
                probs, h, c = model.host_recur(self.weights, timed, h, c, counts)
        else:
            probs, h, c = self._run_rows(sizes, flat, h, c)
        self._h[index] = h
        self._c[index] = c
        return probs

    def _run_rows(
        self, sizes: Sequence[int], windows: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_run` with the session's own :func:`model.forward` (``math="exact"``, and any
        device backend): one forward per block length (a member's state must stop after its
        own last window), state rows up to the device and back."""
        be, w = self.backend, self.weights
        counts = np.asarray(sizes, np.intp)
        steps = int(counts.max())
        if steps == counts.min():  # one forward: every member has the same number of windows
            timed = windows.reshape(len(counts), steps, model.WINDOW).transpose(1, 0, 2)
            got, h, c = model.forward(
                be, w, be.to_device(np.ascontiguousarray(timed)), be.to_device(h), be.to_device(c)
            )
            return be.to_host(got), be.to_host(h), be.to_host(c)
        starts = np.cumsum(counts) - counts
        probs = np.zeros((steps, len(counts)), np.float32)
        h_out, c_out = h.copy(), c.copy()
        for length in sorted(set(sizes), reverse=True):
            group = np.flatnonzero(counts == length)
            timed = windows[starts[group][None, :] + np.arange(length)[:, None]]  # [L, G, 576]
            got, hg, cg = model.forward(
                be, w, be.to_device(timed), be.to_device(h[group]), be.to_device(c[group])
            )
            probs[:length, group] = be.to_host(got)
            h_out[group] = be.to_host(hg)
            c_out[group] = be.to_host(cg)
        return probs, h_out, c_out

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
