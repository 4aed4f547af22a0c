"""Whisper log-mel features, computed on the host with numpy.

Feature extraction is a small, FFT-bound step (a 60 s input is 6000 frames), so it
stays on the host for every backend; the encoder receives the finished
``[80, frames]`` array. The recipe reproduces faster-whisper's ``FeatureExtractor``
exactly (n_fft 400, hop 160, 80 Slaney mel bands, periodic Hann window, 160
trailing zero samples, centre reflect padding, last STFT frame dropped, log10
clamped to 8 below the maximum *of the whole input*, then ``(x + 4) / 4``).
Because the clamp uses the global maximum, long inputs are featurised once, whole,
and then cut into 30 s windows, as faster-whisper does.
"""

from __future__ import annotations

import functools

import numpy as np

from backends.shapes import conv1d_length

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 80
CHUNK_FRAMES = 3000  # 30 s windows of 10 ms frames
TIME_PER_FRAME = HOP_LENGTH / SAMPLE_RATE


@functools.cache
def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-style mel filterbank [n_mels, n_fft // 2 + 1] (librosa ``htk=False``, norm slaney)."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mels = np.linspace(0.0, 45.245640471924965, n_mels + 2)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (freqs[2 : n_mels + 2] - freqs[:n_mels]))[:, None]
    filters: np.ndarray = weights.astype(np.float32)
    filters.flags.writeable = False
    return filters


def log_mel(audio: np.ndarray, padding: int = HOP_LENGTH) -> np.ndarray:
    """Log-mel spectrogram [80, frames] of 16 kHz mono float audio.

    frames = (len + padding) // 160.
    """
    wave = np.asarray(audio, dtype=np.float32)
    if wave.ndim != 1:
        raise ValueError("audio must be mono (1-D)")
    if padding:
        wave = np.pad(wave, (0, padding))
    half = N_FFT // 2
    wave = np.pad(wave, (half, half), mode="reflect")
    n_frames = conv1d_length(wave.shape[0], N_FFT, HOP_LENGTH)  # STFT frames: an unpadded conv
    frames = np.lib.stride_tricks.as_strided(
        wave, (n_frames, N_FFT), (HOP_LENGTH * wave.strides[0], wave.strides[0])
    )
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    spectrum = np.fft.rfft(frames * window, n=N_FFT, axis=-1).astype(np.complex64)
    power = np.abs(spectrum[:-1].T) ** 2  # [freq, frames], last frame dropped
    mel = mel_filters() @ power
    log_spec = np.log10(np.clip(mel, 1e-10, None))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    out: np.ndarray = ((log_spec + 4.0) / 4.0).astype(np.float32, copy=False)
    return out


def pad_or_trim(features: np.ndarray, length: int = CHUNK_FRAMES) -> np.ndarray:
    """Zero-pad (or cut) the frame axis to ``length``, as the encoder expects 3000 frames."""
    frames = features.shape[-1]
    if frames > length:
        return features[..., :length]
    if frames < length:
        widths = [(0, 0)] * (features.ndim - 1) + [(0, length - frames)]
        return np.pad(features, widths)
    return features
