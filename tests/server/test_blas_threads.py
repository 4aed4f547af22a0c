"""Adaptive BLAS threads (server/blas.py): a call alone gets every core, concurrent calls share.

The policy is checked with a recording setter; the real models are checked to give
the declared results at any thread count (docs/server.md: Whisper tokens identical,
Silero VAD probabilities within 1e-5, Piper audio within 1e-4), since OpenBLAS
splits products differently for different thread counts.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import anyio
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from backends import parallel
from server.blas import AdaptiveThreads, threads_for
from server.cmd_serve import BLAS_VARIABLES, limit_blas_threads
from server.config import ConfigError, parse_config
from server.provider import ThreadedProvider
from server.runtime import ModelSpec, Runtime, RuntimeConfig

DATA = Path(__file__).resolve().parents[1] / "data" / "whisper"
VAD_TOLERANCE = 1e-5
PIPER_TOLERANCE = 1e-4


def test_threads_follow_the_calls_in_flight() -> None:
    seen: list[int] = []
    adaptive = AdaptiveThreads(4, seen.append)
    adaptive.enter()  # alone: every core
    adaptive.enter()  # two: half each
    adaptive.enter()  # three on four cores: one each
    adaptive.leave()
    adaptive.leave()
    adaptive.leave()  # idle: the last setting stays until the next call
    assert seen == [4, 2, 1, 2, 4]
    assert [threads_for(calls, 2) for calls in (0, 1, 2, 3)] == [2, 2, 1, 1]


def test_config_threads_auto_by_default_or_fixed() -> None:
    model = {"id": "v", "family": "silero_vad"}
    assert parse_config({"models": [model]}).threads is None
    assert parse_config({"models": [model], "threads": "auto"}).threads is None
    assert parse_config({"models": [model], "threads": 2}).threads == 2
    with pytest.raises(ConfigError, match="threads"):
        parse_config({"models": [model], "threads": "many"})
    with pytest.raises(ConfigError, match="threads"):
        parse_config({"models": [model], "threads": 0})


def test_an_explicit_environment_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in BLAS_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    with threadpool_limits(limits=None):  # restores the process's BLAS threads afterwards
        assert limit_blas_threads(None) == 1
        for var in BLAS_VARIABLES:  # the call exported its choice to all three
            assert os.environ[var] == "1"
            monkeypatch.delenv(var)
        assert limit_blas_threads(None) is None  # auto: the pool gets every core
        assert os.environ["OPENBLAS_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def _audio(name: str) -> np.ndarray:
    with wave.open(str(DATA / f"{name}.wav")) as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / np.float32(32768.0)


def test_real_models_give_the_declared_results_at_every_thread_count() -> None:
    from backends.piper import PiperRequest
    from backends.silero_vad import VadRequest
    from backends.whisper import WhisperRequest

    requests = {
        "asr": WhisperRequest(_audio("weather")),
        "vad": VadRequest(_audio("meeting")),
        "tts": PiperRequest("Hello there, this is a test.", noise_w=0.0, seed=0),
    }
    specs = [
        ModelSpec("asr", "whisper", task="asr"),
        ModelSpec("vad", "silero_vad", task="vad"),
        ModelSpec("tts", "piper", task="tts"),
    ]
    seen: list[int] = []

    async def serve(adaptive: AdaptiveThreads | None) -> dict[str, object]:
        rt = Runtime(ThreadedProvider(threads=adaptive), RuntimeConfig(busy_timeout_ms=0))
        for spec in specs:
            rt.add_model(spec)
        async with rt:
            return {m: await rt.run(m, r) for m, r in requests.items()}

    with threadpool_limits(limits=None):
        with threadpool_limits(limits=1, user_api="blas"):
            one = anyio.run(serve, None)
        cores = len(os.sched_getaffinity(0))
        from server.blas import blas_setter

        setter = blas_setter()
        assert setter is not None

        def record(n: int) -> None:
            seen.append(n)
            setter(n)

        try:
            alone = anyio.run(serve, AdaptiveThreads(cores, record))
        finally:
            parallel.SHARE.set_threads(None)  # later tests follow the BLAS's own count again
    assert seen and set(seen) == {cores}  # one call at a time: every core each time
    tokens = [[w.result.tokens for w in r.windows] for r in (one["asr"], alone["asr"])]
    assert tokens[0] == tokens[1]
    dp = np.abs(one["vad"].probabilities - alone["vad"].probabilities)  # type: ignore[attr-defined]
    assert float(dp.max()) <= VAD_TOLERANCE
    a, b = np.asarray(one["tts"].audio), np.asarray(alone["tts"].audio)  # type: ignore[attr-defined]
    assert a.shape == b.shape and float(np.abs(a - b).max()) <= PIPER_TOLERANCE
