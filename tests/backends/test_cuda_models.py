"""Model-level parity of the CUDA backend with numpy (GPU machines; see model_parity)."""

from __future__ import annotations

import functools

from backends.cuda_backend import CudaBackend
from tests.backends import model_parity
from tests.backends.gpu import needs_gpu


@functools.cache
def _backend() -> CudaBackend:
    from backends.cuda_backend import make_backend

    return make_backend("0")


@needs_gpu
def test_silero_vad_offline_and_streaming_match_numpy() -> None:
    model_parity.check_silero_vad(_backend())


@needs_gpu
def test_silero_vad_sessions_on_forked_streams_share_weights() -> None:
    model_parity.check_silero_vad_forks(_backend(), _backend().fork)


@needs_gpu
def test_whisper_tokens_identical_to_numpy() -> None:
    model_parity.check_whisper(_backend())


@needs_gpu
def test_piper_zero_noise_matches_numpy() -> None:
    model_parity.check_piper(_backend())


def test_host_module_logic_runs_silero_vad_and_piper() -> None:
    """The backend's array-module code (numpy in place of cupy, no fused kernels) runs
    real models here, so the CUDA code path's shapes are exercised without a GPU."""
    host = CudaBackend.on_host()
    model_parity.check_silero_vad(host)
    model_parity.check_piper(host)
