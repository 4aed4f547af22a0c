"""Whisper as a batched engine (issue #14): continuous batching of decoder steps.

Every member runs its request's program (:func:`backends.whisper.program.transcription`:
options, prompt history, temperature fallback, suppression and timestamp rules,
seeking through long audio, word alignment: the session's rules, not a copy) on
its own :class:`~backends.whisper.model.DecoderState` (self-attention KV cache
growing per member, cross-attention K/V from its own encoder output). The engine
answers the programs' operations:

* ``Step`` (one token in, logits out): the current tokens of all members in a
  step go through one :func:`~backends.whisper.model.step_logits` (one product
  per linear layer and one vocabulary projection over the stacked rows, attention
  per member);
* ``SetWindow``: members that need a new 30 s window in the same step (they
  joined, or their window ended and they seek on) share one encoder pass;
* ``Prefill``, ``Rewind`` and ``Align`` (prompt, new candidate, word timestamps at
  the end of a window) run per member, on its state, with the session's
  :class:`~backends.whisper.program.Executor`.

``join`` starts the members' programs and encodes their first windows (they are
then waiting on their first token); ``step`` advances each member by one token,
then runs its program up to its next token, encoding the windows the step opened.
Members join and leave between steps. A stream member's chunks are the segments
of each window as it completes (``Session.stream``); a run member emits the
:class:`~backends.whisper.types.WhisperResult` of ``Session.run`` when its last
window is done. A member's failure (its request, its program, its share of a
batched operation) is its own ``Emitted.error``.

A member whose request has ``vad_chunking`` (:mod:`backends.whisper.pieces`) is
cut at silences by Silero VAD; its pieces are programs of their own, rows of the
same batched operations as every other program (up to
:data:`~backends.whisper.pieces.PIECE_BATCH` at a time, the next piece starting
when one ends), each on a decoder state of its own (the member's slot's, then
states allocated for its further pieces, reused by its later pieces and dropped
when it leaves: the engine keeps no more states than its slots). The session
runs such a request through an engine of one member, so both paths decode the
same batches.

The VAD pass (about 0.15 s for a minute of audio on one core) runs on the
engine's own thread (``speech_thread``, a batching model's engine): ``join``
hands it over and returns, the member's pieces start at the first ``step``
after it has ended, and meanwhile the other members join and step as if it
were not there. A step with nothing else to decode waits for it at most
:data:`SPEECH_WAIT_S` (then returns nothing for the member), so the decode task
neither spins nor keeps a member arriving meanwhile from joining for longer.
One pass runs at a time (passes of members joining together queue); a member
that leaves during its pass does not wait for it (its result is dropped);
``close`` waits for a pass under way. The session's engine of one member runs
the pass in ``join``, in the request's own worker thread.

Batched products round differently from one-row products (float32), so token ids
can differ from the unbatched session only where the top two logits are a near
tie; on numpy a batch of one is bit for bit the session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import attrs
import numpy as np

from backends.base import ArrayBackend, session_backend
from backends.whisper import model
from backends.whisper.decoding import Step
from backends.whisper.longform import SetWindow, Window
from backends.whisper.pieces import PIECE_BATCH, Chunked, Span, SpeechFinder
from backends.whisper.program import Executor, Program, checked, result, transcription
from backends.whisper.tokenizer import WhisperTokenizer
from backends.whisper.types import WhisperRequest
from core.engine import Emitted, Member

SPEECH_WAIT_S = 0.05
"""The longest a step whose members have nothing to decode (only VAD passes under way) waits
for one of those passes to end."""


@attrs.define(eq=False)
class _Row:
    """One program in the batch: a member's request, or one piece of a VAD-chunked request."""

    program: Program
    executor: Executor
    piece: int = -1  # the piece it decodes (VAD-chunked members only)
    waiting: Step | SetWindow | None = None  # None: the program has ended
    windows: list[Window] = attrs.field(factory=list)
    fresh: int = 0  # windows not emitted yet (stream members)


@attrs.define(eq=False)
class _Member:
    """One request in the batch: its rows, what it produced, its error."""

    request: WhisperRequest
    stream: bool
    rows: list[_Row]  # a whole request: one row; chunked: its pieces being decoded
    chunked: Chunked | None = None  # chunked: its pieces, once its VAD pass has ended
    finding: Future[tuple[Span, ...]] | None = None  # chunked: its VAD pass, while it runs
    states: list[model.DecoderState] = attrs.field(factory=list)  # chunked: its slot's and its own
    free: list[model.DecoderState] = attrs.field(factory=list)  # chunked: those no row uses
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        if not self.request.vad_chunking:
            return self.rows[0].waiting is None
        return self.chunked is not None and not self.rows and self.chunked.done


class WhisperEngine:
    """A :class:`core.engine.BatchEngine` over one factory's shared weights (see module doc)."""

    def __init__(
        self,
        backend: ArrayBackend,
        weights: model.WhisperWeights,
        tokenizer: WhisperTokenizer,
        config: Mapping[str, Any],
        alignment_heads: Sequence[tuple[int, int]],
        max_batch: int,
        speech: SpeechFinder | None = None,
        speech_thread: bool = True,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"whisper: max_batch must be at least 1, got {max_batch}")
        self.backend = backend
        self.weights = weights
        self.tokenizer = tokenizer
        self._config = config
        self._heads = alignment_heads
        self._max_batch = max_batch
        self._speech = speech if speech is not None else SpeechFinder(backend)
        self._speech_thread = speech_thread
        self._vad: ThreadPoolExecutor | None = None  # the VAD passes' thread, from the first
        self._vad_backend = backend
        self._states = [model.DecoderState(backend, weights) for _ in range(max_batch)]
        self._members: dict[int, _Member] = {}

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Start each member's program and encode its first window, all in one encoder pass."""
        joined: list[int] = []
        refused: dict[int, BaseException] = {}
        for index, member in enumerate(members):
            try:
                self._members[member.key] = self._admit(member)
            except Exception as error:  # this member only
                refused[index] = error
                continue
            joined.append(member.key)
            self._start(self._members[member.key])
        self._encode(joined)
        return [
            Emitted(member.key, error=refused[index])
            if index in refused
            else self._emit(member.key)
            for index, member in enumerate(members)
        ]

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """One token for every member in ``keys``, then each program up to its next token.

        Chunked members whose VAD pass has ended start their pieces first (see module doc).
        """
        started = self._found(keys)
        stepping = [k for k in keys if self._rows_waiting(k, Step)]
        rows = [(self._members[k], row) for k in stepping for row in self._waiting(k, Step)]
        for (member, row), logits in zip(rows, self._decode([r for _, r in rows]), strict=True):
            if isinstance(logits, BaseException):
                member.error = logits
            else:
                self._advance(member, row, logits)
        for key in stepping:
            self._settle(self._members[key])
        self._encode(list(dict.fromkeys([*started, *stepping])))
        return [self._emit(key) for key in keys]

    def leave(self, key: int) -> None:
        member = self._members.pop(key, None)
        if member is None:
            return
        if member.finding is not None:
            member.finding.cancel()  # if it has not started; else its result is dropped
        for row in member.rows:
            row.program.close()
            row.executor.state.clear()
        for state in member.states:  # the slot's is kept; a chunked member's own are dropped
            state.clear()

    def close(self) -> None:
        for key in list(self._members):
            self.leave(key)
        self._states = []
        if self._vad is not None:
            self._vad.shutdown(wait=True, cancel_futures=True)  # a pass under way ends first
            self._vad = None

    # ---- internals ---------------------------------------------------------
    def _admit(self, member: Member) -> _Member:
        key = member.key
        if not self._states:
            raise RuntimeError("whisper: the engine is closed")
        if not 0 <= key < self._max_batch or key in self._members:
            raise ValueError(f"whisper: key {key} is out of range or in use")
        request = checked(member.request)
        state = self._states[key]
        state.clear()
        if request.vad_chunking:
            joining = _Member(request, member.stream, [], states=[state], free=[state])
            if self._speech_thread:
                vad = self._vad_thread()
                joining.finding = vad.submit(self._speech.spans, request.audio, self._vad_backend)
            else:
                spans = self._speech.spans(request.audio, self.backend)
                joining.chunked = Chunked(request, spans)
            return joining
        row = _Row(self._program(request), self._executor(state))
        return _Member(request, member.stream, [row])

    def _program(self, request: WhisperRequest) -> Program:
        return transcription(request, self.tokenizer, self._config, self.weights.vocab_size)

    def _executor(self, state: model.DecoderState) -> Executor:
        return Executor(self.backend, self.weights, self.tokenizer, self._heads, state)

    def _vad_thread(self) -> ThreadPoolExecutor:
        """The thread of the VAD passes (and their backend: a queue or stream of its own)."""
        if self._vad is None:
            self._vad_backend = session_backend(self.backend)
            self._vad = ThreadPoolExecutor(1, thread_name_prefix="whisper-vad")
        return self._vad

    def _found(self, keys: Sequence[int]) -> list[int]:
        """Start the pieces of the chunked members in ``keys`` whose VAD pass has ended.

        When no member in ``keys`` has a token to decode, wait (at most
        :data:`SPEECH_WAIT_S`) for one of their passes to end. Returns the members started.
        """
        finding = {
            key: member.finding
            for key in keys
            if (member := self._members.get(key)) is not None and member.finding is not None
        }
        if not finding:
            return []
        if not any(self._rows_waiting(key, Step) for key in keys):
            wait(finding.values(), timeout=SPEECH_WAIT_S, return_when=FIRST_COMPLETED)
        started = []
        for key, future in finding.items():
            if not future.done():
                continue
            member = self._members[key]
            member.finding = None
            try:
                member.chunked = Chunked(member.request, future.result())
            except Exception as error:  # this member only
                member.error = error
                continue
            self._start(member)
            started.append(key)
        return started

    def _start(self, member: _Member) -> None:
        """Run a joining member's programs up to their first batched operation."""
        for row in member.rows:
            self._advance(member, row, None)
        self._settle(member)

    def _settle(self, member: _Member) -> None:
        """A chunked member: keep what its ended pieces decoded, start its next pieces.

        What fails here (a decoder state that cannot be had) is the member's error.
        """
        chunked = member.chunked
        if chunked is None or member.error is not None:
            return
        try:
            self._next_pieces(member, chunked)
        except Exception as error:  # this member only
            member.error = error

    def _next_pieces(self, member: _Member, chunked: Chunked) -> None:
        while True:
            for row in [r for r in member.rows if r.waiting is None]:
                chunked.finish(row.piece, row.windows)
                member.rows.remove(row)
                row.executor.state.clear()
                member.free.append(row.executor.state)
            if len(member.rows) >= PIECE_BATCH or (piece := chunked.next_piece()) is None:
                return
            index, request = piece
            row = _Row(self._program(request), self._executor(self._state_for(member)), index)
            member.rows.append(row)
            self._advance(member, row, None)
            if member.error is not None:
                return

    def _state_for(self, member: _Member) -> model.DecoderState:
        """A decoder state for a chunked member's next piece: one an ended piece of it freed, or
        a new one (the member's own until it leaves)."""
        if member.free:
            return member.free.pop()
        state = model.DecoderState(self.backend, self.weights)
        member.states.append(state)
        return state

    def _rows_waiting(self, key: int, kind: type) -> bool:
        return bool(self._waiting(key, kind))

    def _waiting(self, key: int, kind: type) -> list[_Row]:
        """The rows of member ``key`` waiting on ``kind`` (none once the member failed)."""
        member = self._members.get(key)
        if member is None or member.error is not None:
            return []
        return [row for row in member.rows if isinstance(row.waiting, kind)]

    def _advance(self, member: _Member, row: _Row, answer: Any) -> None:
        """Send ``answer`` and run the program until it waits on a batched operation or ends.

        Per-member operations run here, on the row's state; windows are kept.
        """
        try:
            while True:
                try:
                    item = row.program.send(answer)
                except StopIteration:
                    row.waiting = None
                    return
                answer = None
                if isinstance(item, Window):
                    row.windows.append(item)
                    row.fresh += 1
                elif isinstance(item, Step | SetWindow):
                    row.waiting = item
                    return
                else:
                    answer = row.executor.execute(item)
        except Exception as error:  # this member only
            member.error = error

    def _encode(self, keys: Sequence[int]) -> None:
        """Encode the windows the members in ``keys`` wait on, together, until none waits."""
        while rows := [(self._members[k], r) for k in keys for r in self._waiting(k, SetWindow)]:
            errors = self._encode_windows([r for _, r in rows])
            for (member, row), error in zip(rows, errors, strict=True):
                if member.error is not None:
                    continue
                if error is not None:
                    member.error = error
                else:
                    self._advance(member, row, None)
            for member in dict.fromkeys(m for m, _ in rows):
                self._settle(member)

    def _encode_windows(self, rows: list[_Row]) -> list[BaseException | None]:
        """One encoder pass for all ``rows``; should it fail, each alone (the error is its own)."""
        try:
            self._encode_together(rows)
            return [None] * len(rows)
        except Exception:
            out: list[BaseException | None] = []
            for row in rows:
                try:
                    self._encode_together([row])
                    out.append(None)
                except Exception as error:
                    out.append(error)
            return out

    def _encode_together(self, rows: list[_Row]) -> None:
        be, w = self.backend, self.weights
        mels = np.stack([_waiting(r, SetWindow).mel for r in rows])
        encoded = model.encode(be, w, be.to_device(mels))
        for i, row in enumerate(rows):
            part = encoded if len(rows) == 1 else be.slice(encoded, 0, i, i + 1)
            row.executor.state.set_memory(part)

    def _decode(self, rows: list[_Row]) -> list[np.ndarray | BaseException]:
        """Every row's next-token logits from one decoder step; should it fail, each alone."""
        if not rows:
            return []
        try:
            return list(self._decode_together(rows))
        except Exception:
            out: list[np.ndarray | BaseException] = []
            for row in rows:
                try:
                    out.append(self._decode_together([row])[0])
                except Exception as error:
                    out.append(error)
            return out

    def _decode_together(self, rows: list[_Row]) -> list[np.ndarray]:
        be, w = self.backend, self.weights
        states = [r.executor.state for r in rows]
        lengths = [s.length for s in states]
        try:
            tokens = [_waiting(r, Step).token for r in rows]
            logits = be.to_host(model.step_logits(be, w, states, tokens))
        except Exception:
            for state, length in zip(states, lengths, strict=True):
                state.length = length  # a retry runs the same positions again
            raise
        return [logits[i] for i in range(len(rows))]

    def _emit(self, key: int) -> Emitted:
        """What member ``key`` has to report after a join or a step."""
        member = self._members.get(key)
        if member is None:
            return Emitted(key, error=KeyError(f"whisper: no active member {key}"))
        if member.error is not None:
            return Emitted(key, error=member.error)
        done = member.done
        if member.request.vad_chunking:
            if member.chunked is None:  # its VAD pass is under way
                return Emitted(key)
            if member.stream:
                return Emitted(key, member.chunked.take_segments(), done=done)
            return Emitted(key, (member.chunked.result(),), done=True) if done else Emitted(key)
        row = member.rows[0]
        if member.stream:
            fresh = row.windows[len(row.windows) - row.fresh :] if row.fresh else []
            row.fresh = 0
            return Emitted(key, tuple(s for w in fresh for s in w.segments), done=done)
        if not done:
            return Emitted(key)
        return Emitted(key, (result(member.request, row.windows),), done=True)


def _waiting(row: _Row, kind: type[Any]) -> Any:
    if not isinstance(row.waiting, kind):
        raise RuntimeError(f"whisper: member is not waiting on {kind.__name__}")
    return row.waiting
