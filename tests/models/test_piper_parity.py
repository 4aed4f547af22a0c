"""Numpy Piper vs onnxruntime on the same ONNX file, noise off: same frames, same audio.

With noise_scale = noise_w = 0 the model is deterministic, so both runtimes must
agree: per-phoneme durations (frame counts) exactly, audio within ``AUDIO_ATOL``.
The reference graph is patched (as piper-tts does for alignments) to also output
its ``w_ceil`` tensor, the frame count of every phoneme id.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from piper.patch_voice_with_alignment import add_alignment_output

from backends.piper import PiperModel, load_model
from backends.piper.loader import voice_paths

AUDIO_ATOL = 1e-3  # declared before comparing: max |ours - onnxruntime| per sample
HOP = 256

FIXTURE = Path(__file__).parents[1] / "data" / "piper" / "phoneme_ids.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]
SENTENCES = [CASES[0]["ids"][0], CASES[1]["ids"][0], CASES[5]["ids"][0]]  # 31, 109, 195 ids


pytestmark = pytest.mark.usefixtures("one_blas_thread")


@functools.cache
def _model() -> PiperModel:
    return load_model()


@functools.cache
def _reference() -> ort.InferenceSession:
    graph = onnx.load(str(voice_paths()[0]))
    add_alignment_output(graph)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _run_reference(
    ids: list[int], scales: tuple[float, float, float]
) -> tuple[np.ndarray, np.ndarray]:
    audio, w_ceil = _reference().run(
        None,
        {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(scales, dtype=np.float32),
        },
    )
    return audio.reshape(-1), w_ceil.reshape(-1).astype(np.int64)


@pytest.mark.parametrize("length_scale", [1.0, 1.3])
@pytest.mark.parametrize("ids", SENTENCES, ids=[f"{len(s)}ids" for s in SENTENCES])
def test_matches_onnxruntime_without_noise(ids: list[int], length_scale: float) -> None:
    ref_audio, ref_durations = _run_reference(ids, (0.0, length_scale, 0.0))
    out = _model().synthesize_ids(np.array(ids), 0.0, length_scale, 0.0, np.random.default_rng(7))
    np.testing.assert_array_equal(out.durations, ref_durations)
    assert out.audio.shape == ref_audio.shape == (int(ref_durations.sum()) * HOP,)
    err = float(np.max(np.abs(out.audio - ref_audio)))
    print(f"piper parity: {len(ids)} ids, length_scale {length_scale}: max abs err {err:.2e}")
    assert err <= AUDIO_ATOL
    assert float(np.max(np.abs(ref_audio))) > 0.05  # real speech, not a silent pass


def test_noise_is_drawn_from_the_callers_rng() -> None:
    ids = np.array(SENTENCES[0])
    a = _model().synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(1)).audio
    b = _model().synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(1)).audio
    c = _model().synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(2)).audio
    assert a.tobytes() == b.tobytes()
    assert a.shape != c.shape or not np.array_equal(a, c)


@pytest.mark.parametrize("taps", [True, False], ids=["per-tap", "im2col"])
def test_numpy_fast_paths_match_the_generic_backend_code(
    taps: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused host flow and generator (numpy) against the generic layers (XpBackend):
    per-tap GEMMs through numpy's BLAS, and the im2col paths used where it is not found."""
    from backends.piper import blas, host
    from backends.xp_backend import XpBackend

    if taps and not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    monkeypatch.setattr(host, "USE_TAPS", taps)

    assert _model().prepared is not None  # the numpy backend takes the fast paths
    generic = PiperModel(backend=XpBackend(np), weights=_model().weights, config=_model().config)
    assert generic.prepared is None
    ids = np.array(SENTENCES[0])
    fast = _model().synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(3))
    slow = generic.synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(3))
    np.testing.assert_array_equal(fast.durations, slow.durations)
    assert float(np.max(np.abs(fast.audio - slow.audio))) <= 1e-4
