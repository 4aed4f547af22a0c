"""Piper as a batched engine (issue #14): the sentences of a wave synthesized as one batch.

Every member holds its request's :class:`~backends.piper.progress.Progress` (its
sentences, its seeded noise RNG, the frames it has used, the frame limits and
piper's output stage: the session's rules, not a copy). ``join`` only checks and
phonemizes; each ``step`` synthesizes the next sentence of every member in
``keys`` together (:meth:`~backends.piper.model.PiperModel.synthesize_batch`): the
text encoder and duration predictor per sentence, then the flow and the HiFi-GAN
once over a packed batch of them (their frames end to end, masked gaps between
them; with several cores one such batch a core, each of a group of the members).
Members joining in the same step are therefore synthesized together, and with the
members already running.

* A stream member (``stream=True``) emits one chunk per step, the chunk
  ``Session.stream`` yields for that sentence, and is done with its last sentence.
* A run member emits ``Session.run``'s :class:`~backends.piper.api.PiperResult`
  in the step of its last sentence. It plans ahead: each step computes the latents
  (text encoder, durations, noise: :meth:`Progress.plan`) of up to
  :data:`PLAN_AHEAD` more of its sentences, counted toward its limits, while the
  batch decodes the oldest planned one; so a request over its speech limit fails
  after about a sixth of its sentences' steps, not after synthesizing up to the
  limit, and no step does more than that much planning for one member.

A member advances one sentence per step because its noise is drawn in the
session's order (durations' noise, then the flow's, sentence after sentence):
the same seed gives the same noise batched or not, so results equal the unbatched
session's up to float32 summation order (the packed GEMMs): durations exactly,
audio within :data:`AUDIO_TOLERANCE`. A member's failure (a bad request, an audio
limit, an error in its own synthesis) is its own ``Emitted.error``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial

import attrs

from backends.base import ArrayBackend
from backends.piper.api import PiperChunk
from backends.piper.model import Latent, PiperModel, Synthesis, SynthesisInput
from backends.piper.progress import Progress, check_request, request_rng, result_of
from core.engine import Emitted, Member, join_each

AUDIO_TOLERANCE = 1e-4
"""Max |batched - unbatched| per sample (normalized audio), as across BLAS thread counts."""

PLAN_AHEAD = 6
"""Sentences a run member plans (their latents, about a sixth of a sentence's work each) in
one step, beside the one sentence it decodes: one sentence's worth of work more at most."""


@attrs.define(eq=False)
class _Row:
    """One member: its request's progress; a run member's planned latents (index, latent) not
    yet decoded and the chunks it has so far."""

    progress: Progress
    stream: bool
    planned: deque[tuple[int, Latent]] = attrs.field(factory=deque)
    chunks: list[PiperChunk] = attrs.field(factory=list)

    @property
    def done(self) -> bool:
        return self.progress.done and not self.planned


class PiperEngine:
    """A :class:`core.engine.BatchEngine` over one factory's shared model (see module doc)."""

    def __init__(self, model: PiperModel, backend: ArrayBackend, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"piper: max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.backend = backend
        self._max_batch = max_batch
        self._rows: dict[int, _Row] = {}
        self._closed = False

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Check and phonemize each member; one with no sentence at all is done at once."""
        return join_each(members, self._join_one)

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """The next sentence of every member in ``keys``, synthesized as one batch."""
        rows = {k: self._rows[k] for k in keys if k in self._rows}
        inputs: dict[int, SynthesisInput | Latent | Exception] = {}
        for key, row in rows.items():
            try:
                inputs[key] = self._next(row)
            except Exception as error:  # this member only
                inputs[key] = error
        outcomes = self._synthesize(
            {k: i for k, i in inputs.items() if not isinstance(i, Exception)}
        )
        out = []
        for key in keys:
            found = rows.get(key)
            if found is None:
                out.append(Emitted(key, error=KeyError(f"piper: no active member {key}")))
                continue
            row, item = found, inputs[key]
            outcome = item if isinstance(item, Exception) else outcomes[key]
            try:
                chunk = self._finish(row, outcome)
            except Exception as error:  # this member only
                out.append(Emitted(key, error=error))
                continue
            out.append(self._emit(key, row, chunk))
        return out

    def leave(self, key: int) -> None:
        self._rows.pop(key, None)

    def close(self) -> None:
        self._rows.clear()
        self._closed = True

    # ---- internals ---------------------------------------------------------
    def _join_one(self, member: Member) -> Emitted:
        row = self._admit(member)
        if row.done:
            return self._emit(member.key, row, None)
        self._rows[member.key] = row
        return Emitted(member.key)

    def _admit(self, member: Member) -> _Row:
        if self._closed:
            raise RuntimeError("piper: the engine is closed")
        if not 0 <= member.key < self._max_batch or member.key in self._rows:
            raise ValueError(f"piper: key {member.key} is out of range or in use")
        request = member.request
        check_request(request)
        return _Row(Progress.start(self.model, request, request_rng(request)), member.stream)

    def _next(self, row: _Row) -> SynthesisInput | Latent:
        """What ``row`` synthesizes this step: a stream's next sentence; a run member's oldest
        planned latent, after planning up to :data:`PLAN_AHEAD` more sentences."""
        if row.stream:
            return row.progress.next_input()
        if not row.progress.done:
            latent = partial(self.model.latent, self.backend)
            row.planned.extend(row.progress.plan(latent, PLAN_AHEAD))
        return row.planned[0][1]

    @staticmethod
    def _finish(row: _Row, outcome: Synthesis | Exception) -> PiperChunk:
        """The chunk of the sentence :meth:`_next` gave ``row``, from the batch's outcome."""
        if row.stream:
            return row.progress.finish(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        index, _ = row.planned.popleft()
        return row.progress.output(index, outcome.audio)

    def _synthesize(
        self, inputs: dict[int, SynthesisInput | Latent]
    ) -> dict[int, Synthesis | Exception]:
        """Every member's sentence in one batch; should the batch itself fail, each alone,
        so that a failure lands on the member that caused it."""
        if not inputs:
            return {}
        keys = list(inputs)
        drawn = {k: i for k, i in inputs.items() if isinstance(i, SynthesisInput)}
        states = {k: i.rng.bit_generator.state for k, i in drawn.items()}  # latents drew theirs
        try:
            results = self.model.synthesize_batch([inputs[k] for k in keys], self.backend)
            return dict(zip(keys, results, strict=True))
        except Exception:
            out: dict[int, Synthesis | Exception] = {}
            for key in keys:
                if key in drawn:
                    drawn[key].rng.bit_generator.state = states[key]  # redraw the same noise
                try:
                    out[key] = self.model.synthesize_batch([inputs[key]], self.backend)[0]
                except Exception as error:  # this member's own failure
                    out[key] = error
            return out

    def _emit(self, key: int, row: _Row, chunk: PiperChunk | None) -> Emitted:
        """What ``row`` produced with this step's ``chunk`` (None: nothing to synthesize)."""
        done = row.done
        if row.stream:
            return Emitted(key, () if chunk is None else (chunk,), done=done)
        if chunk is not None:
            row.chunks.append(chunk)
        if not done:
            return Emitted(key)
        return Emitted(key, (result_of(row.chunks, self.model.config.sample_rate),), done=True)
