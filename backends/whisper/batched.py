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

Batched products round differently from one-row products (float32), so token ids
can differ from the unbatched session only where the top two logits are a near
tie; on numpy a batch of one is bit for bit the session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from backends.base import ArrayBackend
from backends.whisper import model
from backends.whisper.decoding import Step
from backends.whisper.longform import SetWindow, Window
from backends.whisper.program import Executor, Program, checked, result, transcription
from backends.whisper.tokenizer import WhisperTokenizer
from backends.whisper.types import WhisperRequest
from core.engine import Emitted, Member


@attrs.define(eq=False)
class _Member:
    """One request in the batch: its program, where it waits, what it produced."""

    request: WhisperRequest
    stream: bool
    program: Program
    executor: Executor
    waiting: Step | SetWindow | None = None  # None: the program has ended
    windows: list[Window] = attrs.field(factory=list)
    fresh: int = 0  # windows not emitted yet (stream members)
    error: BaseException | None = None


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
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"whisper: max_batch must be at least 1, got {max_batch}")
        self.backend = backend
        self.weights = weights
        self.tokenizer = tokenizer
        self._config = config
        self._heads = alignment_heads
        self._max_batch = max_batch
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
            self._advance(self._members[member.key], None)
        self._encode(joined)
        return [
            Emitted(member.key, error=refused[index])
            if index in refused
            else self._emit(member.key)
            for index, member in enumerate(members)
        ]

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """One token for every member in ``keys``, then each program up to its next token."""
        stepping = [k for k in keys if self._waiting_on(k, Step)]
        for key, logits in self._decode(stepping).items():
            member = self._members[key]
            if isinstance(logits, BaseException):
                member.error = logits
            else:
                self._advance(member, logits)
        self._encode(stepping)
        return [self._emit(key) for key in keys]

    def leave(self, key: int) -> None:
        member = self._members.pop(key, None)
        if member is not None:
            member.program.close()
            member.executor.state.clear()

    def close(self) -> None:
        for key in list(self._members):
            self.leave(key)
        self._states = []

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
        executor = Executor(self.backend, self.weights, self.tokenizer, self._heads, state)
        steps = transcription(request, self.tokenizer, self._config, self.weights.vocab_size)
        return _Member(request, member.stream, steps, executor)

    def _waiting_on(self, key: int, kind: type) -> bool:
        member = self._members.get(key)
        return member is not None and member.error is None and isinstance(member.waiting, kind)

    def _advance(self, member: _Member, answer: Any) -> None:
        """Send ``answer`` and run the program until it waits on a batched operation or ends.

        Per-member operations run here, on the member's state; windows are kept.
        """
        try:
            while True:
                try:
                    item = member.program.send(answer)
                except StopIteration:
                    member.waiting = None
                    return
                answer = None
                if isinstance(item, Window):
                    member.windows.append(item)
                    member.fresh += 1
                elif isinstance(item, Step | SetWindow):
                    member.waiting = item
                    return
                else:
                    answer = member.executor.execute(item)
        except Exception as error:  # this member only
            member.error = error

    def _encode(self, keys: Sequence[int]) -> None:
        """Encode the windows the members in ``keys`` wait on, together, until none waits."""
        while waiting := [k for k in keys if self._waiting_on(k, SetWindow)]:
            for key, error in self._encode_windows(waiting).items():
                member = self._members[key]
                if error is not None:
                    member.error = error
                else:
                    self._advance(member, None)

    def _encode_windows(self, keys: list[int]) -> dict[int, BaseException | None]:
        """One encoder pass for all ``keys``; should it fail, each alone (the error is its own)."""
        try:
            self._encode_together(keys)
            return dict.fromkeys(keys)
        except Exception:
            out: dict[int, BaseException | None] = {}
            for key in keys:
                try:
                    self._encode_together([key])
                    out[key] = None
                except Exception as error:
                    out[key] = error
            return out

    def _encode_together(self, keys: list[int]) -> None:
        be, w = self.backend, self.weights
        members = [self._members[k] for k in keys]
        mels = np.stack([_waiting(m, SetWindow).mel for m in members])
        encoded = model.encode(be, w, be.to_device(mels))
        for i, member in enumerate(members):
            rows = encoded if len(members) == 1 else be.slice(encoded, 0, i, i + 1)
            member.executor.state.set_memory(rows)

    def _decode(self, keys: list[int]) -> dict[int, np.ndarray | BaseException]:
        """Every member's next-token logits from one decoder step; should it fail, each alone."""
        if not keys:
            return {}
        try:
            return dict(zip(keys, self._decode_together(keys), strict=True))
        except Exception:
            out: dict[int, np.ndarray | BaseException] = {}
            for key in keys:
                try:
                    out[key] = self._decode_together([key])[0]
                except Exception as error:
                    out[key] = error
            return out

    def _decode_together(self, keys: list[int]) -> list[np.ndarray]:
        be, w = self.backend, self.weights
        members = [self._members[k] for k in keys]
        states = [m.executor.state for m in members]
        lengths = [s.length for s in states]
        try:
            tokens = [_waiting(m, Step).token for m in members]
            logits = be.to_host(model.step_logits(be, w, states, tokens))
        except Exception:
            for state, length in zip(states, lengths, strict=True):
                state.length = length  # a retry runs the same positions again
            raise
        return [logits[i] for i in range(len(members))]

    def _emit(self, key: int) -> Emitted:
        """What member ``key`` has to report after a join or a step."""
        member = self._members.get(key)
        if member is None:
            return Emitted(key, error=KeyError(f"whisper: no active member {key}"))
        if member.error is not None:
            return Emitted(key, error=member.error)
        done = member.waiting is None
        if member.stream:
            fresh = member.windows[len(member.windows) - member.fresh :] if member.fresh else []
            member.fresh = 0
            return Emitted(key, tuple(s for w in fresh for s in w.segments), done=done)
        if not done:
            return Emitted(key)
        return Emitted(key, (result(member.request, member.windows),), done=True)


def _waiting(member: _Member, kind: type[Any]) -> Any:
    if not isinstance(member.waiting, kind):
        raise RuntimeError(f"whisper: member is not waiting on {kind.__name__}")
    return member.waiting
