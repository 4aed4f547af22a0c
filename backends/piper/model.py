"""VITS inference for one sentence: phoneme ids -> float32 audio (the ONNX graph's function).

``PiperModel`` holds only immutable things (backend, device weights, config), so
any number of sessions can share one. Noise comes from the caller's RNG.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from backends.base import Array, ArrayBackend
from backends.piper import host
from backends.piper.api import FrameLimitError
from backends.piper.duration import log_durations
from backends.piper.flow import flow_reverse, flow_reverse_host, prepare_flow
from backends.piper.generator import generate, generate_host, prepare_generator
from backends.piper.loader import Hyper, VoiceConfig
from backends.piper.text_encoder import encode


@attrs.frozen(eq=False)
class Synthesis:
    """Audio of one sentence plus the frame count per phoneme id (its alignment)."""

    audio: np.ndarray
    durations: np.ndarray


@attrs.frozen(eq=False)
class PiperModel:
    """Shared, immutable: the backend, the weights uploaded once, the voice config."""

    backend: ArrayBackend
    weights: Mapping[str, Array]
    config: VoiceConfig
    hyper: Hyper = attrs.field(factory=Hyper)
    prepared: host.Prepared | None = attrs.field(init=False, repr=False)
    """The flow's and generator's convs as fused-conv operands on the numpy backend (None
    elsewhere), built once per model."""

    @prepared.default
    def _prepare(self) -> host.Prepared | None:
        if not host.is_host(self.backend):
            return None
        convs, ups = prepare_generator(self.weights, self.hyper)
        return host.Prepared({**prepare_flow(self.weights, self.hyper), **convs}, ups)

    def synthesize_ids(
        self,
        phoneme_ids: np.ndarray,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        rng: np.random.Generator,
        backend: ArrayBackend | None = None,
        max_frames: int | None = None,
    ) -> Synthesis:
        """Same inputs as the ONNX model (ids and scales); noise drawn from ``rng``.

        ``backend`` is the calling session's view (its own queue); default: the model's.
        ``max_frames`` bounds the output (``hop_length`` samples a frame) and so the
        memory: every id gets at least one frame, so more ids than that fail before the
        encoder, and more predicted frames fail before the flow and vocoder
        (:class:`FrameLimitError`).
        """
        be, w, h = backend or self.backend, self.weights, self.hyper
        ids = np.asarray(phoneme_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("no phoneme ids")
        if ids.min() < 0 or ids.max() >= h.n_vocab:
            raise ValueError(f"phoneme ids must be in [0, {h.n_vocab})")
        t = int(ids.size)
        if max_frames is not None and t > max_frames:
            raise FrameLimitError(t, max_frames)
        x, m, logs = encode(be, w, h, ids)
        dp_noise = rng.standard_normal((1, 2, t), dtype=np.float32) * np.float32(noise_w)
        logw = log_durations(be, w, h, x, dp_noise)
        durations = np.ceil(np.exp(logw) * np.float32(length_scale)).astype(np.int64)
        frames = max(int(durations.sum()), 1)
        if max_frames is not None and frames > max_frames:
            raise FrameLimitError(frames, max_frames)
        if durations.sum() > 0:
            index = np.repeat(np.arange(t), durations)
            m = be.take(m, index, 2)
            logs = be.take(logs, index, 2)
        else:  # no phoneme got a frame: the path matrix is all zero
            m = be.zeros((1, h.inter, 1))
            logs = be.zeros((1, h.inter, 1))
        noise = be.to_device(rng.standard_normal((1, h.inter, frames), dtype=np.float32))
        z_p = be.add(m, be.scale(be.mul(noise, be.exp(logs)), noise_scale))
        if self.prepared is not None and host.is_host(be):
            z_host = flow_reverse_host(self.prepared.convs, h, z_p[0])
            audio = generate_host(self.prepared, h, z_host)
        else:
            z = flow_reverse(be, w, h, z_p)
            audio = be.to_host(generate(be, w, h, z)).reshape(-1)
        return Synthesis(audio=audio.astype(np.float32, copy=False), durations=durations)
