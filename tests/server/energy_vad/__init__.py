"""energy_vad: a tiny VAD family for the registry test (a frame whose RMS is over the threshold
is speech), shaped as a real backend package: ``load_factory(backend, **options)`` returning a
:class:`core.pool.SessionFactory` whose sessions run, stream and batch.

With :data:`ENTRY` (its one registry entry, adapter included) registered, the configuration,
the provider and the HTTP routes serve it without any other module changing
(tests/server/test_family_registry.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from backends.identity import HasIdentity, Identity
from core.pool import Interface, Session
from server.families.base import MODES, Family, FamilyAdapter
from server.http.body import number

NAME, TASK, RATE = "energy_vad", "vad", 16000


@attrs.frozen
class EnergyRequest:
    audio: np.ndarray
    threshold: float = 0.01


@attrs.frozen
class EnergyChunk:
    index: int
    rms: float


@attrs.frozen
class EnergyResult:
    segments: tuple[tuple[int, int], ...]  # speech as [start, end) sample ranges
    rms: tuple[float, ...]
    duration_s: float


class EnergySession(HasIdentity):
    def __init__(self, identity: Identity, frame: int) -> None:
        self.identity, self.frame = identity, frame

    def frames(self, request: EnergyRequest) -> list[float]:
        audio = np.asarray(request.audio, np.float64)
        starts = range(0, audio.size, self.frame)
        return [float(np.sqrt(np.mean(audio[s : s + self.frame] ** 2))) for s in starts]

    def run(self, request: EnergyRequest) -> EnergyResult:
        rms = self.frames(request)
        segments: list[tuple[int, int]] = []
        for i, value in enumerate(rms):
            if value <= request.threshold:
                continue
            start, end = i * self.frame, min((i + 1) * self.frame, request.audio.size)
            if segments and segments[-1][1] == start:
                start = segments.pop()[0]
            segments.append((start, end))
        return EnergyResult(tuple(segments), tuple(rms), request.audio.size / RATE)

    def stream(self, request: EnergyRequest) -> Iterator[EnergyChunk]:
        for i, value in enumerate(self.frames(request)):
            yield EnergyChunk(i, value)

    def batch(self, requests: Sequence[EnergyRequest]) -> list[EnergyResult]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        return None

    def close(self) -> None:
        return None


class EnergyFactory(HasIdentity):
    def __init__(self, mode: str, frame: int) -> None:
        self.identity = Identity(NAME, TASK, mode, frozenset(Interface))
        self.frame = frame

    def capacity(self) -> int:
        return 16

    def create(self) -> Session:
        return EnergySession(self.identity, self.frame)

    def clone(self, primary: Session) -> Session:
        return EnergySession(self.identity, self.frame)


def load_factory(backend: Any = None, **options: Any) -> EnergyFactory:
    """Options: ``mode`` (from the model's spec) and ``frame_ms`` ("10" or "20")."""
    mode = str(options.pop("mode", "offline"))
    frame_ms = int(options.pop("frame_ms", "20"))
    if options:
        raise ValueError(f"energy_vad: unknown options {sorted(options)}")
    return EnergyFactory(mode, frame_ms * RATE // 1000)


class EnergyAdapter:
    """The family's HTTP adapter: ``threshold`` and audio in, speech sample ranges out."""

    task = TASK
    sample_rate = RATE

    def check(self, spec_id: str, mode: str, what: str) -> None:
        return None

    def voices(self) -> list[str]:
        return []

    def check_fields(self, body: Mapping[str, Any]) -> float | None:
        return number(body, "threshold", 0.0, 1.0)

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> EnergyRequest:
        threshold = self.check_fields(body)
        return EnergyRequest(audio, 0.01 if threshold is None else threshold)

    def json(self, result: EnergyResult, probabilities: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "segments": [{"start_sample": s, "end_sample": e} for s, e in result.segments],
            "duration": round(result.duration_s, 4),
        }
        if probabilities:
            out["probabilities"] = [round(v, 6) for v in result.rms]
        return out

    def chunk_json(self, chunk: EnergyChunk) -> dict[str, Any]:
        return {"index": chunk.index, "rms": round(chunk.rms, 6)}

    def duration(self, result: EnergyResult) -> float:
        return result.duration_s


def adapter() -> FamilyAdapter:
    return EnergyAdapter()


ENTRY = Family(
    name=NAME,
    task=TASK,
    backend=__name__,
    adapter=adapter,
    modes=MODES,
    load_options={"frame_ms": ("10", "20")},
    mode_option=True,
)
"""The family's one registry entry."""
